"""One gRPC unary call with Python's grpcio (insecure channel: HTTP/2 with prior knowledge) to
127.0.0.1:PORT, method METHOD, printing the outcome as JSON: {"code": "OK" | status name, "details": ...}.
Usage: grpc_call.py PORT METHOD"""
import json
import sys

import grpc


def main():
    port, method = sys.argv[1], sys.argv[2]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
        try:
            reply = call(b"\x08\x01", timeout=10)
            print(json.dumps({"code": "OK", "reply": reply.hex()}))
        except grpc.RpcError as error:
            print(json.dumps({"code": error.code().name, "details": error.details()}))


main()
