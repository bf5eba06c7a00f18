"""The runtime's process: its options, the launch under torchrun, the world of process groups, the
watchdog and the user code it loads."""
