"""The model registry on the inference side: learned models loaded, verified and swapped without a restart.

Sources of a model:
- ``model_published`` (the trainer stored ``<version>/<file>`` in the Object Store bucket
  ``agmarl_models``): every file its manifest lists is fetched and its sha256 checked (the event's
  actor digest and manifest must agree with the stored ones), the sessions are built and the model
  is cached, ready for the selection that names it; it does not change what serves;
- a selection ``model:<ref>`` (the adaptive-engine's KV ``active_policy`` or policy_selection event,
  or ``agmarl policy set``): ``latest`` (the newest model loaded), ``default`` (``models/default``), a
  version (cached already, being fetched, on disk, or fetched from the Object Store) or a model folder;
  a selection that wraps one (``cpu-first:model:<ref>``, ``registry.WRAPPERS``) serves that model, loaded the
  same way, inside its wrappers;
- at start, ``models/default`` when present, inside the wrappers of the settings' ``initial_policy`` (the
  adaptive-engine's first selection, ``cpu-first:model:default`` by default), until a selection arrives.

Every model is checked before it is built: its ``manifest.sig`` must verify against a trusted public key
(settings ``trusted_model_keys``, default the shipped ``models/trusted``), so the manifest and with it every
file digest is the trainer's; a folder on disk is loaded only from an allowed directory (``allowed_model_dirs``,
default ``models/`` and ``.state/models``); versions are single path components. docs/security.md.

Fetching and digest checks happen on the event loop's side (I/O); checks of large files and building the
ONNX Runtime sessions run in a worker thread, and the swap is one assignment on the event loop, so a
decision uses either the old or the new model, never a mix. A model that cannot be fetched, fails a
digest or does not load is refused: the previous model (or the baseline) keeps serving and
``agmarl_model_load_failures_total{reason}`` counts it (reason: not_found, unsigned, untrusted, signature,
not_allowed, digest, missing, invalid, fetch, load).

Which policy serves: the selection, and only the selection (every switch is a PolicySelection event
with its reason; the adaptive-engine turns a published model into one when its promotion rule
allows). A selection applies when its model is loaded, unless a newer selection has been applied
meanwhile. With no selection at all, ``models/default`` serves from the start. When the newest selection's
model is refused, a ``SelectionRefused`` event (subject ``selection_refused``: the policy, the refusal
reason and its detail) tells the adaptive-engine, which rolls the selection back; a refused selection that
a newer one has overtaken is only logged.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from typing import Callable, Mapping

from prometheus_client import Counter, Gauge

from agmarl_common.runtime import messages as m
from agmarl_common.serving import modelstore
from agmarl_common.runtime import subjects
from agmarl_common.serving.onnx_model import OnnxModelPolicy
from agmarl_common.core.policies.registry import is_model, model_ref, unwrap, with_model, wrap
from agmarl_common.runtime.service import ServiceRuntime

KEEP_VERSIONS = 3  # loaded models kept in memory (the active one, the previous ones for rollbacks)
MAX_DETAIL = 500  # characters of a refusal's detail sent in SelectionRefused

Apply = Callable[[object, str, m.PolicySelection], None]  # (policy, model version, selection)


class ModelRegistry:
    def __init__(self, rt: ServiceRuntime, apply: Apply, trust: modelstore.ModelTrust | None = None):
        """``apply(policy, version, selection)`` installs a policy as the app's active (or canary) policy;
        ``trust`` (which keys and directories models may come from) defaults to the settings'."""
        self.rt, self.apply = rt, apply
        self.trust = trust or modelstore.ModelTrust.load(getattr(rt.settings, "trusted_model_keys", ""),
                                                         getattr(rt.settings, "allowed_model_dirs", ""))
        self.models: OrderedDict[str, OnnxModelPolicy] = OrderedDict()
        self.fetching: dict[str, asyncio.Task] = {}  # version -> its fetch in progress (a selection joins it)
        self.latest: OnnxModelPolicy | None = None
        self.default: OnnxModelPolicy | None = None
        self.explicit = False  # a selection was made (KV or event), not only the settings' baseline
        self._gen = self._applied = 0
        self.failures = Counter("agmarl_model_load_failures_total", "Model versions refused or not loaded",
                                ["reason"], registry=rt.registry)
        self.loads = Counter("agmarl_model_loads_total", "Model versions loaded", ["source"], registry=rt.registry)
        self.info = Gauge("agmarl_model_loaded_info", "Newest loaded model version (value 1)", ["version"],
                          registry=rt.registry)
        self.last_error = ""
        self.last_reason, self.last_detail = "", ""
        self._failed = 0  # refusals so far (a selection tells its own from earlier ones)

    # --- loading -----------------------------------------------------------------------------------

    def _fail(self, reason: str, err: BaseException | str) -> None:
        self.failures.labels(reason=reason).inc()
        self.last_error = f"{reason}: {err}"
        self.last_reason, self.last_detail = reason, str(err)
        self._failed += 1
        self.rt.log.warning("model refused (%s): %s", reason, err)

    def _keep(self, policy: OnnxModelPolicy, source: str) -> OnnxModelPolicy:
        self.models[policy.version] = policy
        self.models.move_to_end(policy.version)
        while len(self.models) > KEEP_VERSIONS:
            self.models.popitem(last=False)
        self.loads.labels(source=source).inc()
        return policy

    async def _build(self, load: Callable[[], modelstore.ModelArtifact], source: str) -> OnnxModelPolicy | None:
        """Verify + build in a worker thread; failures are counted, never raised."""
        try:
            objective = getattr(self.rt.settings, "objective", "composite")
            scheme = getattr(self.rt.settings, "scheme", "fixed")
            policy = await asyncio.to_thread(lambda: OnnxModelPolicy(load(), objective=objective, scheme=scheme))
        except modelstore.ModelNotFoundError as err:
            self._fail("not_found", err)
            return None
        except modelstore.ModelIntegrityError as err:
            self._fail(err.reason, err)
            return None
        except Exception as err:  # noqa: BLE001 - a model ONNX Runtime cannot load is refused, not fatal
            self._fail("load", f"{type(err).__name__}: {err}")
            return None
        self.rt.log.info("model %s loaded from %s", policy.version, source)
        return self._keep(policy, source.split(" ")[0])

    async def fetch(self, version: str, expected_sha256: str = "",
                    expected_files: Mapping[str, str] | None = None) -> OnnxModelPolicy | None:
        """``<version>/*`` from the Object Store, verified and built (None when refused); one fetch per
        version at a time: a selection arriving while the published event's fetch runs waits for it."""
        task = self.fetching.get(version)
        if task is None:
            task = asyncio.ensure_future(self._fetch(version, expected_sha256, expected_files))
            self.fetching[version] = task
            task.add_done_callback(lambda _t: self.fetching.pop(version, None))
        return await asyncio.shield(task)

    async def _fetch(self, version: str, expected_sha256: str,
                     expected_files: Mapping[str, str] | None) -> OnnxModelPolicy | None:
        try:
            files = await modelstore.fetch_files(self.rt.bus, version)
        except modelstore.ModelNotFoundError as err:
            self._fail("not_found", err)
            return None
        except modelstore.ModelIntegrityError as err:
            self._fail(err.reason, err)
            return None
        except Exception as err:  # noqa: BLE001 - NATS down, timeouts
            self._fail("fetch", f"{type(err).__name__}: {err}")
            return None
        src = f"objectstore {version}"
        return await self._build(lambda: modelstore.load_bytes(files, src, expected_sha256, expected_files,
                                                               trust=self.trust), src)

    async def resolve(self, ref: str) -> OnnxModelPolicy | None:
        """The model ``model:<ref>`` names: loaded already, on disk, or fetched from the Object Store."""
        if ref in ("", "latest"):
            return self.latest or await self.load_default()
        if ref == "default":
            return await self.load_default()
        if ref in self.models:
            self.models.move_to_end(ref)
            return self.models[ref]
        if ref in self.fetching:
            return await self.fetch(ref)
        if modelstore.local_dir(ref) is not None:
            return await self._build(lambda: modelstore.load_local(ref, trust=self.trust), f"disk {ref}")
        return await self.fetch(ref)

    async def load_default(self) -> OnnxModelPolicy | None:
        if self.default is None and modelstore.local_dir("default") is not None:
            self.default = await self._build(lambda: modelstore.load_local("default", trust=self.trust),
                                             "disk default")
            if self.default is not None and self.latest is None:
                self._set_latest(self.default)
        return self.default

    def _set_latest(self, policy: OnnxModelPolicy) -> None:
        self.latest = policy
        self.info.clear()
        self.info.labels(version=policy.version).set(1)

    # --- events --------------------------------------------------------------------------------------

    def claim(self, sel: m.PolicySelection) -> bool:
        """Every selection passes here first. True: a model selection, loaded and applied later by this
        registry; False: the caller applies it now (a baseline)."""
        self._gen += 1
        self.explicit = True
        if not is_model(sel.policy):
            self._applied = self._gen
            return False
        self.rt.spawn(self._select(sel, self._gen), name=f"select {sel.policy}")
        return True

    async def _select(self, sel: m.PolicySelection, gen: int) -> None:
        failed = self._failed
        ref = model_ref(sel.policy)
        policy = await self.resolve(ref)
        if policy is None:
            self.rt.log.warning("selection %s: no such model could be loaded; keeping the current policy", sel.policy)
            if gen == self._gen:  # still the newest selection: the adaptive-engine rolls it back
                reason, detail = (self.last_reason, self.last_detail) if self._failed > failed \
                    else ("not_found", f"no model {ref or 'latest'} to load")
                await self._refuse(sel.policy, reason, detail)
            return
        self._install(policy, sel, gen)

    async def _refuse(self, policy: str, reason: str, detail: str) -> None:
        try:
            await self.rt.publish(subjects.selection_refused(), m.SelectionRefused(
                policy=policy, reason=reason, detail=detail[:MAX_DETAIL], time=time.time()))
        except Exception as err:  # noqa: BLE001 - NATS down: the refusal stays in the log and the metrics
            self.rt.log.warning("selection %s refused, but the event could not be sent: %s", policy, err)

    def _install(self, policy: OnnxModelPolicy, sel: m.PolicySelection, gen: int) -> None:
        if gen <= self._applied:
            self.rt.log.info("model %s loaded, but a newer selection is in force", policy.version)
            return
        self._applied = gen
        self.apply(wrap(unwrap(sel.policy)[0], policy), policy.version, sel)

    async def on_published(self, msg: m.ModelPublished) -> OnnxModelPolicy | None:
        """Fetch, verify, build and cache (the newest loaded: ``model:latest``); what serves is unchanged
        until a selection names it."""
        policy = await self.fetch(msg.version, msg.sha256, msg.manifest.get("files"))
        if policy is not None:
            self._set_latest(policy)
            self.rt.log.info("model %s published: cached; it serves once a selection names it", policy.version)
        return policy

    async def start(self, initial: str = "") -> None:
        """At start, with no selection made: ``models/default`` serves when present, inside the wrappers of
        ``initial`` when that names a model (``cpu-first:model:default``: the rule around it)."""
        default = await self.load_default()
        if default is not None and not self.explicit:
            self._gen += 1
            name = with_model(initial, default.version) if is_model(initial) else default.name
            self._install(default, m.PolicySelection(policy=name, model_version=default.version,
                                                     reason="models/default at start", time=time.time()), self._gen)

    def details(self) -> dict:
        return {"model_latest": self.latest.version if self.latest else "", "models_loaded": list(self.models),
                "model_last_error": self.last_error}
