"""What the state machines do at each step, over the adapters; the handlers call one step each."""
