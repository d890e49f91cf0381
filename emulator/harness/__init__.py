"""Worlds in this process on moto's mock, shared by the tests and the benchmarks: the control plane on the
stack's resources (control_plane), the provision machine with scripted agents (provision_world,
scripted_agents), the ingress behind the webhook (webhooks), and the test App (github_app). The whole
system on moto's server, with real agents, is emulator/world.py."""
