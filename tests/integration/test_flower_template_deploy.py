"""Flower's app template (``flower_template/``, see test_flower_template.py) under IMA over
FedCDA in a deployment: a SuperLink and 2 SuperNodes as processes on 127.0.0.1, ``flwr
run``, 2 rounds; every reply used, federated accuracy rising, no ERROR, no traceback, no
refused reply.  Its own module so that it runs beside the simulations of
test_flower_template.py.
"""

from __future__ import annotations

import pytest

from tests.integration.test_flower_template import APP, check

pytestmark = [pytest.mark.slow, pytest.mark.deploy]


def test_flowers_template_in_a_deployment(tmp_path):
    from launch.deploy import LocalDeployment

    # small: in a deployment every message starts a ClientApp process (torch, the data)
    dep = LocalDeployment(tmp_path / "deploy", num_nodes=2)
    try:
        dep.up()
        out = dep.flwr_run(APP, {"strategy": "fedcda+ima", "num-server-rounds": 2}, timeout=400)
    finally:
        dep.down()
    check(out, "fedcda+ima", nodes=2, rounds_run=2)
