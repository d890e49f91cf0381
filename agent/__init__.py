"""The instance agent: the only code that runs on the EC2 runners.

It talks to the control plane only through its own items in the state table (heartbeat, signals,
its instance record) and never the other way round; see DESIGN.md sections 3 to 7.
"""
