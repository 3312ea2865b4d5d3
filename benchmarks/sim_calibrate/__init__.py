"""The simulator's calibration against one testbed host: profile steps, rounds, prediction."""
