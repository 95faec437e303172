"""modelstore.in_object_store against a real nats-server Object Store."""
import uuid

import pytest

from agmarl_common.serving import modelstore
from agmarl_common.runtime import subjects
from agmarl_common.runtime.bus import Bus


@pytest.mark.parametrize("name,stored,expected", [
    ("v-{id}", True, True),        # <version>/manifest.json there
    ("v-{id}", False, False),      # nothing stored under that version
    ("", False, False),            # empty version
    ("../v-{id}", True, False),    # path-like versions are never looked up
    (".hidden-{id}", True, False),
])
async def test_in_object_store(nats_url, name, stored, expected):
    version = name.format(id=uuid.uuid4().hex[:8])
    bus = await Bus.connect(nats_url, "test-modelstore")
    try:
        if stored:
            await bus.object_put(subjects.MODELS_BUCKET, f"{version}/{modelstore.MANIFEST}", b"{}")
        assert await modelstore.in_object_store(bus, version) is expected
    finally:
        await bus.close()
