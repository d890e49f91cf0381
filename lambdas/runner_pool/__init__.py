"""runner-pool: warm-pool self-hosted EC2 runners for GitHub Actions, the control plane's code."""
