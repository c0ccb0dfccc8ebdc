"""A loaded tensor model: its served versions, each with backend instances and a scheduler (the dynamic batcher,
the sequence batcher or the ensemble runner), plus metadata and validated inference (see validation.py).

Loading is blocking (weights, warmup) and happens off the event loop; inference is async.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engines.backends import create_backend
from engines.interface import TensorBackend
from engines.types import TensorModelSpec, TensorSpec
from gateway.errors import ConfigError, InternalError, InvalidRequestError, NotFoundError
from gateway.observability.inference_stats import ModelStats
from gateway.repository.layout import ModelDir, resolve_source
from gateway.repository.serving import InFlight
from gateway.repository.tensor_config import DynamicBatching, InstanceGroup, TensorModelConfig
from gateway.scheduler.tensor.dynamic_batcher import BatchingPolicy, DynamicBatcher, QueueRules
from gateway.scheduler.tensor.rate_limiter import InstanceGate, RateLimiter
from gateway.tensor.tensors import DATATYPES, InputTensor, OutputTensor, TensorCodecError, decode_binary_tensor
from gateway.tensor.triton_config import config_json
from gateway.tensor.validation import finish_outputs, prepare_inputs

log = logging.getLogger("switchyard.tensor")

#: Triton's `default-max-batch-size`: what auto-complete gives a batchable model whose config omits max_batch_size.
DEFAULT_MAX_BATCH_SIZE = 4


def batching_policy(config: TensorModelConfig) -> BatchingPolicy:
    """The dynamic batcher's settings from the config (microseconds -> seconds)."""
    dyn = config.dynamic_batching
    if dyn is None:
        return BatchingPolicy(max_batch_size=config.max_batch_size, decoupled=config.decoupled)

    def rules(p: Any) -> QueueRules:
        return QueueRules(
            p.timeout_action, p.default_timeout_microseconds / 1e6, p.allow_timeout_override, p.max_queue_size
        )

    return BatchingPolicy(
        max_batch_size=config.max_batch_size,
        dynamic=config.max_batch_size > 0,
        preferred_sizes=tuple(dyn.preferred_batch_size),
        max_queue_delay_s=dyn.max_queue_delay_microseconds / 1e6,
        preserve_ordering=dyn.preserve_ordering,
        priority_levels=dyn.priority_levels,
        default_priority=dyn.default_priority_level,
        queue_rules={0: rules(dyn.default_queue_policy), **{k: rules(v) for k, v in dyn.priority_queue_policy.items()}},
        decoupled=config.decoupled,
    )


def _specs(tensors: Sequence[Any]) -> list[TensorSpec]:
    return [TensorSpec(t.name, t.data_type, list(t.dims), getattr(t, "optional", False)) for t in tensors]


@dataclass
class TensorVersion:
    """One served version: its instances (one backend object each), batcher and statistics."""

    version: int
    instances: list[TensorBackend]
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    batcher: Any  # DynamicBatcher, or a sequence/ensemble scheduler with the same infer/infer_stream/start/stop
    stats: ModelStats = field(default_factory=ModelStats)
    facts: dict[str, Any] = field(default_factory=dict)
    gates: list[InstanceGate] = field(default_factory=list)  # rate limiter access per instance (empty: limiter off)


class TensorModel:
    """A tensor model as served: `versions` by number, metadata, config and validated inference."""

    def __init__(
        self,
        model_dir: ModelDir,
        config: TensorModelConfig,
        limiter: RateLimiter | None = None,
        cpu_threads: int | None = None,
    ) -> None:
        """`cpu_threads`: the model's share of the CPU budget (gateway/repository/cpu_plan.py), or None."""
        self.name = model_dir.name
        self.cpu_threads = cpu_threads
        self.limiter = limiter  # the server's rate limiter (--rate-limit execution_count), or None
        self.dir = model_dir
        self.config = config
        self.backend = config.resolved_backend
        self.versions: dict[int, TensorVersion] = {}
        self.in_flight = InFlight(self.name)  # requests running here; a reload hands new ones to the successor

    # ------------------------------------------------------------------ loading (blocking)

    def selected_versions(self) -> list[int]:
        available = self.dir.versions
        if not available and (self.config.model.source or self.backend == "ensemble"):
            available = (1,)  # weights elsewhere, or nothing to load: version folders are optional
        chosen = self.config.version_policy.select(available)
        if not chosen:
            raise ConfigError(
                f"{self.dir.config_path}: no version folder matches version_policy "
                f"(found {list(available) or 'none'}); "
                f"add a version folder such as {self.dir.path.name}/1/ or fix version_policy."
            )
        return chosen

    def _spec(self, version: int, index: int) -> TensorModelSpec:
        source = None
        if self.config.model.source:
            source = str(resolve_source(self.dir, self.config.model.source, "model.source"))
        return TensorModelSpec(
            name=self.name,
            version=version,
            model_dir=str(self.dir.path),
            version_dir=str(self.dir.path / str(version)),
            max_batch_size=self.config.max_batch_size,
            inputs=_specs(self.config.input),
            outputs=_specs(self.config.output),
            parameters=dict(self.config.parameters),
            default_model_filename=self.config.default_model_filename or None,
            source=source,
            instance_index=index,
            decoupled=self.config.decoupled,
            config=config_json(self.name, self.config, _specs(self.config.input), _specs(self.config.output)),
            cpu_threads=self.cpu_threads,
        )

    def load(self, make_scheduler: Callable[[TensorModel, TensorVersion], Any] | None = None) -> None:
        """Create and load every instance of every selected version, run warmup, build the schedulers.

        On any failure everything loaded so far is unloaded again and a `ConfigError` says what went wrong."""
        loaded: list[TensorBackend] = []
        try:
            self._complete_batching()
            for version in self.selected_versions():
                self._load_version(version, loaded, make_scheduler)
        except Exception as exc:
            for entry in self.versions.values():
                for gate in entry.gates:
                    gate.close()
            for backend in loaded:
                try:
                    backend.unload()
                except Exception:
                    log.exception("model '%s' failed to unload after a failed load", self.name)
            self.versions.clear()
            if isinstance(exc, ConfigError):
                raise
            log.exception("model '%s' failed to load", self.name)
            raise ConfigError(
                f"{self.dir.config_path}: the model failed to load ({type(exc).__name__}: {str(exc)[:300]})"
            ) from None
        if any(g.kind == "KIND_GPU" for g in self.config.instance_group):
            log.warning("model '%s': instance_group kind KIND_GPU runs on the CPU in this build", self.name)

    def _complete_batching(self) -> None:
        """Triton's auto-complete of `max_batch_size`: a config that omits it, for a model file whose tensors all
        start with a variable batch dimension, gets DEFAULT_MAX_BATCH_SIZE and (without another scheduler) the
        dynamic batcher. Only backends that can tell from the file (`TensorBackend.batch_dimension`) take part."""
        config = self.config
        if "max_batch_size" in config.model_fields_set or self.backend == "ensemble":
            return
        latest = self.selected_versions()[-1]
        try:
            if not create_backend(self.backend).batch_dimension(self._spec(latest, 0)):
                return
        except ValueError:
            return  # a missing library or file: loading the version says so, with the fix
        update: dict[str, Any] = {"max_batch_size": DEFAULT_MAX_BATCH_SIZE}
        if config.sequence_batching is None and config.dynamic_batching is None:
            update["dynamic_batching"] = DynamicBatching()
        self.config = config.model_copy(update=update)
        log.info(
            "model '%s': max_batch_size %d and dynamic batching filled in from the model file (Triton's "
            "auto-complete); set max_batch_size to choose",
            self.name,
            DEFAULT_MAX_BATCH_SIZE,
        )

    def _load_version(
        self,
        version: int,
        loaded: list[TensorBackend],
        make_scheduler: Callable[[TensorModel, TensorVersion], Any] | None,
    ) -> None:
        instances: list[TensorBackend] = []
        for index in range(self.config.instance_count if self.backend != "ensemble" else 0):
            try:
                backend = create_backend(self.backend)
                backend.load(self._spec(version, index))
            except ValueError as exc:
                raise ConfigError(f"{self.dir.config_path}: version {version}: {exc}") from None
            instances.append(backend)
            loaded.append(backend)
        facts = instances[0].describe() if instances else {}
        inputs = _specs(self.config.input) or list(facts.get("inputs", []))
        outputs = _specs(self.config.output) or list(facts.get("outputs", []))
        if not inputs or not outputs:
            raise ConfigError(f"{self.dir.config_path}: declare the model's 'input' and 'output' tensors.")
        stats = ModelStats()
        entry = TensorVersion(version, instances, inputs, outputs, None, stats, facts)
        self._warmup(entry)
        self.versions[version] = entry  # from here a failed load closes its gates
        entry.gates = self._gates(version, len(instances))
        custom = make_scheduler(self, entry) if make_scheduler is not None else None
        entry.batcher = custom or DynamicBatcher(
            self.name, instances, batching_policy(self.config), stats, entry.gates or None
        )

    def _gates(self, version: int, count: int) -> list[InstanceGate]:
        """One rate limiter gate per instance, with its instance group's resources and priority."""
        if self.limiter is None or not count:
            return []
        groups = self.config.instance_group or []
        plan: list[InstanceGroup | None] = [g for g in groups for _ in range(g.count)] or [None]
        gates: list[InstanceGate] = []
        try:
            for index, group in enumerate(plan[:count]):
                limits = group.rate_limiter if group is not None else None
                resources = [(r.name, r.count, r.is_global) for r in limits.resources] if limits is not None else []
                gates.append(
                    self.limiter.gate(
                        f"{self.name}/{version}/{index}", resources, limits.priority if limits is not None else 0
                    )
                )
        except ConfigError as exc:
            for gate in gates:
                gate.close()
            raise ConfigError(f"{self.dir.config_path}: {exc}") from None
        return gates

    def _warmup(self, entry: TensorVersion) -> None:
        for warm in self.config.model_warmup:
            request: dict[str, np.ndarray] = {}
            rows = [warm.batch_size] if self.config.max_batch_size > 0 and warm.batch_size > 0 else []
            for name, spec in warm.inputs.items():
                shape = tuple(rows + list(spec.dims))
                if spec.input_data_file is not None:
                    request[name] = self._warmup_file(spec.input_data_file, spec.data_type, shape)
                elif spec.data_type == "BYTES":
                    request[name] = np.full(shape, b"", dtype=object)
                elif spec.random_data:
                    request[name] = np.random.default_rng(0).random(shape).astype(DATATYPES[spec.data_type])
                else:
                    request[name] = np.zeros(shape, dtype=DATATYPES[spec.data_type])
            for instance in entry.instances:
                for _ in range(warm.count):
                    try:
                        results = instance.execute([request])
                        if self.config.decoupled:
                            for _response in results[0]:
                                pass
                    except Exception as exc:
                        raise ConfigError(
                            f"{self.dir.config_path}: model_warmup '{warm.name}' failed ({type(exc).__name__}: "
                            f"{str(exc)[:200]}); fix the warmup inputs or the model."
                        ) from None

    def _warmup_file(self, name: str, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
        folder = (self.dir.path / "warmup").resolve()
        path = (folder / name).resolve()
        if folder not in path.parents or not path.is_file():
            raise ConfigError(f"{self.dir.config_path}: warmup file '{name}' must exist inside {self.name}/warmup/.")
        try:
            return decode_binary_tensor(datatype, list(shape), path.read_bytes(), f"warmup file '{name}'")
        except TensorCodecError as exc:
            raise ConfigError(f"{self.dir.config_path}: {exc}") from None

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        for entry in self.versions.values():
            await entry.batcher.start()

    async def stop(self) -> None:
        for entry in self.versions.values():
            await entry.batcher.stop()
            for gate in entry.gates:
                gate.close()
        for entry in self.versions.values():
            for instance in entry.instances:
                try:
                    await asyncio.to_thread(instance.unload)
                except Exception:
                    log.exception("model '%s' failed to unload cleanly", self.name)

    # ------------------------------------------------------------------ description

    def version(self, version: str | int | None = None) -> TensorVersion:
        """A served version ('' or None = the latest); 404 otherwise."""
        if version in (None, "", -1, "-1"):
            return self.versions[max(self.versions)]
        try:
            number = int(version)
        except (TypeError, ValueError):
            raise NotFoundError(f"model '{self.name}' has no version '{str(version)[:40]}'") from None
        if number not in self.versions:
            raise NotFoundError(f"model '{self.name}' version {number} is not loaded")
        return self.versions[number]

    @property
    def platform(self) -> str:
        return self.config.platform or self.backend

    def metadata(self, version: str | None = None) -> dict[str, Any]:
        entry = self.version(version)
        lead = [-1] if self.config.max_batch_size > 0 else []

        def tensor(spec: TensorSpec) -> dict[str, Any]:
            return {"name": spec.name, "datatype": spec.datatype, "shape": lead + list(spec.dims)}

        return {
            "name": self.name,
            "versions": [str(v) for v in sorted(self.versions)],
            "platform": self.platform,
            "inputs": [tensor(s) for s in entry.inputs],
            "outputs": [tensor(s) for s in entry.outputs],
        }

    def config_json(self, version: str | None = None) -> dict[str, Any]:
        entry = self.version(version)
        return config_json(self.name, self.config, entry.inputs, entry.outputs)

    # ------------------------------------------------------------------ inference

    async def infer(
        self,
        inputs: Sequence[InputTensor],
        wanted: Sequence[str] = (),
        version: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> tuple[TensorVersion, list[OutputTensor]]:
        """One request through the batcher; returns the version that served it and its outputs."""
        if self.in_flight.successor is not None:  # reloaded since the caller looked this copy up
            return await self.in_flight.successor.infer(inputs, wanted, version, parameters)
        self.in_flight.enter()
        try:
            entry = self.version(version)
            arrays, rows, priority, timeout = self._prepare(entry, inputs, parameters)
            result = await entry.batcher.infer(arrays, rows, priority, timeout, **_sequence_kwargs(entry, parameters))
            return entry, finish_outputs(self.name, self.config, entry.outputs, result, wanted)
        finally:
            self.in_flight.leave()

    async def infer_stream(
        self,
        inputs: Sequence[InputTensor],
        wanted: Sequence[str] = (),
        version: str | None = None,
        parameters: dict[str, Any] | None = None,
    ) -> AsyncIterator[tuple[TensorVersion, list[OutputTensor]]]:
        """Like `infer`, for decoupled models: one item per response."""
        if self.in_flight.successor is not None:  # reloaded since the caller looked this copy up
            async with contextlib.aclosing(
                self.in_flight.successor.infer_stream(inputs, wanted, version, parameters)
            ) as rest:
                async for item in rest:
                    yield item
            return
        self.in_flight.enter()
        try:
            entry = self.version(version)
            arrays, rows, priority, timeout = self._prepare(entry, inputs, parameters)
            stream = entry.batcher.infer_stream(arrays, rows, priority, timeout, **_sequence_kwargs(entry, parameters))
            async with contextlib.aclosing(stream):
                async for result in stream:
                    if not isinstance(result, dict):
                        log.error("model '%s' streamed a %s instead of a dict", self.name, type(result).__name__)
                        raise InternalError(f"model '{self.name}' returned an invalid response")
                    yield entry, finish_outputs(self.name, self.config, entry.outputs, result, wanted)
        finally:
            self.in_flight.leave()

    def _prepare(
        self, entry: TensorVersion, inputs: Sequence[InputTensor], parameters: dict[str, Any] | None
    ) -> tuple[dict[str, np.ndarray], int, int | None, int | None]:
        """Validated inputs and scheduling parameters; a refused request counts as a failure (reason OTHER), as an
        input Triton rejects does."""
        try:
            arrays, rows = prepare_inputs(self.name, self.config, entry.inputs, inputs)
            return (arrays, rows, *_scheduling(parameters or {}))
        except InvalidRequestError:
            entry.stats.record_failure(0, "OTHER")
            raise

    def describe(self) -> dict[str, Any]:
        """Facts for /v1/models: the latest version's `max_model_len` etc., as the backend reported them."""
        return self.version().facts


def _int_param(parameters: dict[str, Any], key: str) -> int | None:
    value = parameters.get(key)
    if value is None:
        return None
    if type(value) is not int:
        raise InvalidRequestError(f"parameter '{key}' must be an integer")
    return value


def _scheduling(parameters: dict[str, Any]) -> tuple[int | None, int | None]:
    priority = _int_param(parameters, "priority")
    if priority is not None and priority < 0:
        raise InvalidRequestError("parameter 'priority' must be non-negative")
    return priority, _int_param(parameters, "timeout")


def _sequence_kwargs(entry: TensorVersion, parameters: dict[str, Any] | None) -> dict[str, Any]:
    """Sequence parameters go only to schedulers that take them (the stateful sequence batcher)."""
    if not getattr(entry.batcher, "takes_sequence_parameters", False):
        return {}
    return {"parameters": parameters or {}}
