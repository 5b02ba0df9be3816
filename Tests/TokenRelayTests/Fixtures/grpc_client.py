#!/usr/bin/env python3
"""grpcio calls to `test.Api` (Fixtures/grpc_api_server.py) at 127.0.0.1:PORT over an insecure channel (HTTP/2
with prior knowledge), printing one JSON object with the outcome. Usage: grpc_client.py PORT MODE [ARGS]

  burst N                  N unary calls at once on one channel -> {"codes": [...], "details": [...], "replies": [...]}
  late N                   the same with /test.Api/Late (a refusal as HEADERS + trailers, no DATA)
  refuse N                 the same with /test.Api/Refuse (always UNAUTHENTICATED)
  until_connections K MAX  unary calls in rounds of 20 concurrent ones until a reply reports K distinct
                           upstream connections at the server (each GOAWAY makes one more), at most MAX
                           calls -> {"codes": [...], "connections": highest reported}
  collect N                one client-streaming call of N messages -> {"code": ..., "reply": ...}
  watch                    one server-streaming call -> {"messages": [...], "code": ..., "details": ...}
  slow MS                  one server-streaming call whose first message comes after MS ms, as for watch
Every call has a 20 s deadline.
"""
import json
import sys

import grpc

DEADLINE = 20


def code_of(future):
    """(status name, details, reply bytes or None)"""
    try:
        return "OK", "", future.result()
    except grpc.RpcError as error:
        return error.code().name, error.details(), None


def burst(channel, count, start=0, method="/test.Api/Unary"):
    call = channel.unary_unary(method)
    pending = [call.future(f"call-{start + index}".encode(), timeout=DEADLINE) for index in range(count)]
    return [code_of(future) for future in pending]


def main():
    port, mode, args = sys.argv[1], sys.argv[2], [int(a) for a in sys.argv[3:]]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        if mode in ("burst", "late", "refuse"):
            method = {"burst": "/test.Api/Unary", "late": "/test.Api/Late", "refuse": "/test.Api/Refuse"}[mode]
            results = burst(channel, args[0], method=method)
            replies = [json.loads(reply) for _, _, reply in results if reply is not None]
            print(json.dumps({"codes": [code for code, _, _ in results], "details": [details for _, details, _ in results],
                              "replies": replies}))
        elif mode == "until_connections":
            wanted, most = args
            codes, seen = [], 0
            while len(codes) < most and seen < wanted:
                results = burst(channel, min(20, most - len(codes)), start=len(codes))
                codes += [code for code, _, _ in results]
                seen = max([seen] + [json.loads(reply)["connections"] for _, _, reply in results if reply is not None])
            print(json.dumps({"codes": codes, "connections": seen}))
        elif mode == "collect":
            call = channel.stream_unary("/test.Api/Collect")
            code, _, reply = code_of(call.future(iter([b"m" * 100] * args[0]), timeout=DEADLINE))
            print(json.dumps({"code": code, "reply": json.loads(reply) if reply else None}))
        elif mode in ("watch", "slow"):
            method, request = ("/test.Api/Watch", b"watch") if mode == "watch" else ("/test.Api/Slow", str(args[0]).encode())
            call = channel.unary_stream(method)(request, timeout=DEADLINE)
            messages = []
            try:
                for message in call:
                    messages.append(message.decode())
                code, details = "OK", ""
            except grpc.RpcError as error:
                code, details = error.code().name, error.details()
            print(json.dumps({"messages": messages, "code": code, "details": details}))
        else:
            sys.exit(f"unknown mode {mode}")


main()
