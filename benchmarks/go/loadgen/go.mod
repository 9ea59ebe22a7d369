// The load generator of benchmarks/bench_adapter_peers.py: standard library only, so it builds offline.
module gpuscale.bench/loadgen

go 1.22
