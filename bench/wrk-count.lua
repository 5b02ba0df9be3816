-- wrk script for a fixed number of requests (bench/run.sh, bench/profile.sh): the (single) thread stops
-- after COUNT responses and leaves the file MARKER; wrk itself waits for its duration, so the caller
-- interrupts it once the marker exists (wrk then prints its summary).
local done_count = 0
local limit = tonumber(os.getenv("COUNT"))
response = function(status, headers, body)
    done_count = done_count + 1
    if done_count == limit then
        local f = io.open(os.getenv("MARKER"), "w")
        f:close()
        wrk.thread:stop()
    end
end
