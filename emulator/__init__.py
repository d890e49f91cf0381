"""The local emulator: the whole system on one machine, over moto; the ground of tests, demo and bench."""
