"""Splitting the roster over machines: declared and learned costs (`cost`), the balancer
(`balance`) and `ablate plan` itself (`planner`).
"""
