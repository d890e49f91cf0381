"""The demo and the scenarios played on the emulator: what `make demo` plays, measures, prints and charts.

The emulator (`emulator/`) is the ground they are played on, and imports nothing from here.
"""
