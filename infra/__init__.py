"""The CDK app that deploys runner-pool: one stack composed of one construct per concern."""
