"""What the state machines do at each step, over collaborators typed as the domain's ports (wiring.py
builds the adapters); the handlers call one step each."""
