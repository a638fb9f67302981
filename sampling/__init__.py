"""Sampling parameters, the batched numpy sampler, refusal errors, and the JSON Schema grammar."""
