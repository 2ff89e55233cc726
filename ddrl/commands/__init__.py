"""The `ddrl` command's subcommands that run or prepare training, one module each (`ddrl.cli`
names them), and the argument types they share. `ddrl bench` and `analysis` are their own
packages."""
