"""ddrl: distributed deep RL on Atari as HPC batch jobs."""
