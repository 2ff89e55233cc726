from ddrl.cli import entry

entry()
