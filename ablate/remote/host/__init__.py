"""What runs on any host for the controller: the probe's reads and writes, and the host agent."""
