"""sglang_sim: a test double of SGLang 0.5.23's server process for the lab (see tests/lab/README.md).

Run as ``python -m sglang_sim.launch_server`` with SGLang's flags. Standard library only.
"""
