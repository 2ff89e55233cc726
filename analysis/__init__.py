"""Post-hoc analysis of ddrl HDF5 run logs."""
