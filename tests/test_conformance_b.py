"""The conformance suite's other half of the model types (test_conformance.py says what it checks)."""

from conformance import installed_types
from conformance_models import CONFIGS
from conformance_suite import suite

CONFIGURED = [k for k in installed_types() if k in CONFIGS]
test_plain_equals_mlx_lm, test_drafter_alone_equals_mlx_lm, test_drafter_batched_equals_mlx_lm = suite(CONFIGURED[1::2])
