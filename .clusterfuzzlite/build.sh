#!/bin/bash -eu
# ClusterFuzzLite / OSS-Fuzz build: compile every cargo-fuzz target and copy
# it, with its seed corpus, where the engine expects it.
cd "$SRC/durable-agent"
cargo fuzz build -O
for target in $(cargo fuzz list); do
  cp "fuzz/target/x86_64-unknown-linux-gnu/release/$target" "$OUT/"
  if [ -d "fuzz/seeds/$target" ]; then
    (cd "fuzz/seeds/$target" && zip -q -r "$OUT/${target}_seed_corpus.zip" .)
  fi
done
