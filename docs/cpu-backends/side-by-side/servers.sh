#!/bin/bash
# llama-server on the built-in model: plain, and each of its n-gram drafts (one slot each).
cd /work/main; . .venv/bin/activate
port=8201
for d in none ngram-simple ngram-map-k ngram-map-k4v ngram-mod ngram-cache; do
  setsid nohup python -m specdemo serve llama.cpp --model builtin:smollm2-135m --draft $d --port $port > /work/data/bench18/server-$d.log 2>&1 &
  echo "$d $port" >> /work/data/bench18/ports.txt; port=$((port+1))
done
