#!/bin/sh
# A fake meshstudio-engine for tst_ui_run's flood test: ignores its arguments ("launch CONFIG -- ...") and writes
# 1,000,000 metrics lines to stdout as fast as awk can, in the engine's line formats (engine/runtime/metrics.h):
# line 1 run_start, line 1,000,000 run_end, and for line k in between: spans when k % 1000 == 0, else log when
# k % 100 == 0, else eval when k % 10 == 0, else the next step (899,999 steps in all). Step s has loss
# 2 + (s % 1000) / 8, except a spike of 1000 at step 123457; the eval of line k has loss 3 + (k % 77) / 4
# (both exact in binary). When every line is written (awk exited), it creates the file $MS_FLOOD_DONE.
awk 'BEGIN {
  s = 0
  print "{\"v\":1,\"type\":\"run_start\",\"name\":\"flood\",\"ranks\":1,\"steps\":899999}"
  for (k = 2; k < 1000000; k++) {
    if (k % 1000 == 0)
      printf "{\"v\":1,\"type\":\"spans\",\"step\":%d,\"ranks\":[{\"rank\":0,\"spans\":[{\"action\":\"F\",\"layer\":\"block.0\",\"mb\":0,\"start\":0.5,\"end\":0.75}]}]}\n", s
    else if (k % 100 == 0)
      printf "{\"v\":1,\"type\":\"log\",\"level\":\"info\",\"message\":\"flood %d\"}\n", k
    else if (k % 10 == 0)
      printf "{\"v\":1,\"type\":\"eval\",\"step\":%d,\"loss\":%.2f,\"samples\":64}\n", s, 3 + (k % 77) / 4
    else {
      s++
      printf "{\"v\":1,\"type\":\"step\",\"step\":%d,\"loss\":%.3f,\"lr\":0.0003,\"grad_norm\":1.5,\"step_time_s\":0.01,\"samples_per_s\":400,\"tokens_per_s\":12800}\n", s, (s == 123457 ? 1000 : 2 + (s % 1000) / 8)
    }
  }
  printf "{\"v\":1,\"type\":\"run_end\",\"status\":\"ok\",\"reason\":\"\",\"step\":%d}\n", s
}' || exit 1
if [ -n "$MS_FLOOD_DONE" ]; then : > "$MS_FLOOD_DONE"; fi
