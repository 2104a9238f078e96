"""mamba-ssm kernel tests (placeholder until the suite lands)."""
