#!/bin/sh
# wait for E3c (trainc.sh), then resume the chain (chain15.sh: generation resumes with --resume)
while [ ! -f /work/data/E3c.done ]; do
  pgrep -f trainc.sh > /dev/null || break   # E3c stopped without finishing: go on anyway
  sleep 30
done
exec /work/data/chain15.sh
