"""The local emulator: the whole system on one machine, over moto, for the demo, tests and benchmarks."""
