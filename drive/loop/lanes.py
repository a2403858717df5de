"""Lanes in closed loop: one controller call for the K cars a process drives (drive/loop/rollout.py `run_lanes`).

- `predict_lanes`: the lanes' frames coded, stacked and padded to `agents.lane_noise.MIN_ROWS` rows, one `predict` with
  one generator per lane (`LaneGenerators`), per lane its prediction, internals (taken from the batch only when
  read) and the call's latency. A lane's prediction is the one it gets alone, bit for bit
  (tests/drive/loop/test_lanes.py), so records do not depend on K.
- `expert_lanes`: the experts' actions on the lanes' states, one call for the lanes sharing an expert (PPO or pure
  pursuit; each row computed alone, agents/experts/), so `drive collect --envs K`, the DAgger labels and the
  shadow experts of `drive eval` pay one expert call per step, not K.
- `act_lanes`: each lane's step; lanes whose policy is, or wraps through `lane_inner`, a controller policy of one
  shared model go through one `predict_lanes` call (their shadow experts through one `expert_lanes` call), then
  each lane's `decide` and its wrappers' `wrap`; lanes driven by an expert through one `expert_lanes` call; any
  other policy acts alone.
- `lane_copies`: K independent copies of a policy (episode state, generators, gate) that share its torch modules;
  `cars_per_process`: the K of `--envs 0` (eval, dagger, collect).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from agents.lane_noise import MIN_ROWS, LaneGenerators
from datasets.frames import FRAME_SIZE
from drive.devices import to_device, to_host
from drive.loop.rollout import Internals, StepPrediction


class _Row(Mapping[str, np.ndarray]):
    """One lane's row of a batched forward's internals, taken only when read (most steps nobody reads them)."""

    def __init__(self, arrays: Mapping[str, tuple[np.ndarray, int]], row: int):
        self._arrays, self._row = arrays, row
        self._taken: dict[str, np.ndarray] = {}

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._taken:
            a, axis = self._arrays[name]
            self._taken[name] = np.take(a, self._row if a.shape[axis] > 1 else 0, axis=axis)
        return self._taken[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)


def _internals(model: torch.nn.Module, lanes: int) -> list[Internals | None]:
    """The controller's internals of the last forward, one per lane (its row, batch axis dropped; a batch axis of
    size 1 is shared by all lanes), with the head axes it declares."""
    values = model.internals()  # type: ignore[operator]
    if not values:
        return [None] * lanes
    batch_axes = getattr(model, "internal_batch_axes", {})
    heads, indices = dict(getattr(model, "internal_head_axes", {})), tuple(getattr(model, "internal_indices", ()))
    arrays = {name: (to_host(v.detach()).numpy(), batch_axes.get(name, 0)) for name, v in values.items()}
    return [Internals(_Row(arrays, b), heads, indices) for b in range(lanes)]


_SPARE: dict[torch.device, torch.Generator] = {}  # per device: draws of the rows that only pad a batch (discarded)


@torch.inference_mode()
def predict_lanes(
    lanes: Sequence[Any], frames: Sequence[np.ndarray]
) -> list[tuple[StepPrediction, Internals | None, float]]:
    """One controller call for the lanes' raw (96, 96, 3) frames (one lane per policy, all sharing one model and
    sample count): per lane its prediction, internals and the call's latency in ms (what each car waited).

    The batch is padded to `MIN_ROWS` and each lane samples from its own generator (agents/lane_noise.py), so a lane's
    prediction is the same whichever lanes share the call: one car and sixteen drive the same episode.
    """
    model, samples = lanes[0].model, lanes[0].samples
    coder = lanes[0].coder
    form = (coder.coding, coder.input, coder.k)
    if any(
        p.model is not model or p.samples != samples or (p.coder.coding, p.coder.input, p.coder.k) != form
        for p in lanes
    ):
        raise ValueError("predict_lanes: every lane must share one model, sample count and frame coding")
    if not getattr(model, "lane_sampling", False) and len(lanes) > 1:
        return [out for p, f in zip(lanes, frames, strict=True) for out in predict_lanes([p], [f])]
    t0 = time.perf_counter()
    device = lanes[0].device
    k = len(lanes)
    stacks = np.empty((k, coder.k, FRAME_SIZE, FRAME_SIZE), np.uint8)  # (K, k, 84, 84)
    for p, f, slot in zip(lanes, frames, stacks, strict=True):
        p.coder.push_into(f, slot)
    x = to_device(coder.transform(torch.from_numpy(stacks)), device)  # (K, k, 84, 84)
    generator: torch.Generator = lanes[0].generator
    if getattr(model, "lane_sampling", False):
        pad = max(0, MIN_ROWS - k)
        x = torch.cat([x, x[:1].expand(pad, *x.shape[1:])]) if pad else x  # (max(K, MIN_ROWS), k, 84, 84)
        spare = _SPARE.setdefault(device, torch.Generator(device))
        generator = LaneGenerators([p.generator for p in lanes] + [spare] * pad)
    # `predict`, not total_variance(moments): the same for sampled methods, and the closed form where a method
    # has one (DER: mean gamma, E[sigma^2], E[sigma^2] / nu; one moments() draw would act on a sampled mean)
    pred = model.predict(x, samples, generator)  # type: ignore[operator]  # (K', D) each
    latency_ms = (time.perf_counter() - t0) * 1e3
    mean, alea, epi = (to_host(v[:k]).numpy() for v in pred)  # (K, D) each
    internals = _internals(model, x.shape[0])[:k]
    return [(StepPrediction(mean[b], alea[b], epi[b]), internals[b], latency_ms) for b in range(k)]


def expert_lanes(experts: Sequence[Any], states: Sequence[np.ndarray]) -> list[np.ndarray]:
    """Each expert's (3,) action on its state: experts of one `lane_key` (the PPO expert: its policy; pure pursuit:
    its config) in one `act_many` call, each row what it gets alone (agents/experts/); any other expert acts
    alone."""
    groups: dict[Any, list[int]] = {}
    for i, expert in enumerate(experts):
        if hasattr(expert, "act_many") and hasattr(expert, "lane_key"):
            groups.setdefault(expert.lane_key, []).append(i)
    outs: list[np.ndarray | None] = [None] * len(experts)
    for members in groups.values():
        actions = experts[members[0]].act_many(np.stack([np.asarray(states[i]) for i in members]))
        for i, action in zip(members, actions, strict=True):
            outs[i] = action
    return [
        np.asarray(e.act(s) if out is None else out, np.float32)
        for e, s, out in zip(experts, states, outs, strict=True)
    ]


def _state(info: Mapping[str, Any], who: str) -> np.ndarray:
    if "state" not in info:
        raise KeyError(f"{who} needs info['state'] (privileged state) from the env")
    return np.asarray(info["state"])


def act_lanes(policies: Sequence[Any], obs: Sequence[Any], infos: Sequence[Mapping[str, Any]]) -> list[Any]:
    """Each lane's step, what each lane's `act` would return alone. Lanes whose policy is (or wraps, through
    `lane_inner`) a `ControllerPolicy` of one shared model go through one `predict_lanes` call, their shadow experts
    through one `expert_lanes` call; lanes driven by an expert (`ExpertPolicy`) through one `expert_lanes` call."""
    if len(policies) == 1:  # one lane: its own `act` is the definition, and nothing is left to batch
        return [policies[0].act(obs[0], infos[0])]
    chains = []
    for policy in policies:
        chain = [policy]
        while hasattr(chain[-1], "lane_inner"):
            chain.append(chain[-1].lane_inner)
        chains.append(chain)
    groups: dict[tuple[int, int], list[int]] = {}
    driving_experts: list[int] = []
    for i, chain in enumerate(chains):
        if hasattr(chain[-1], "decide") and hasattr(chain[-1], "model"):  # a controller policy
            groups.setdefault((id(chain[-1].model), chain[-1].samples), []).append(i)
        elif hasattr(chain[-1], "lane_expert"):  # an expert policy
            driving_experts.append(i)
    inner: list[Any] = [None] * len(policies)  # the chain root's step, before its wrappers
    for members in groups.values():
        roots = [chains[i][-1] for i in members]
        shadowed = [i for i, root in zip(members, roots, strict=True) if root.shadow is not None]
        labels: dict[int, np.ndarray] = {}
        if shadowed:
            labels = dict(
                zip(
                    shadowed,
                    expert_lanes(
                        [chains[i][-1].shadow for i in shadowed],
                        [_state(infos[i], "the shadow expert") for i in shadowed],
                    ),
                    strict=True,
                )
            )
        for i, root, pred in zip(members, roots, predict_lanes(roots, [obs[i] for i in members]), strict=True):
            inner[i] = root.decide(*pred, infos[i], expert=labels.get(i))
    if driving_experts:
        actions = expert_lanes(
            [chains[i][-1].lane_expert for i in driving_experts],
            [_state(infos[i], "ExpertPolicy") for i in driving_experts],
        )
        for i, action in zip(driving_experts, actions, strict=True):
            inner[i] = action
    outs: list[Any] = []
    for i, (policy, o, info) in enumerate(zip(policies, obs, infos, strict=True)):
        if inner[i] is None:
            outs.append(policy.act(o, info))
            continue
        out = inner[i]
        for wrapper in reversed(chains[i][:-1]):
            out = wrapper.wrap(out)
        outs.append(out)
    return outs


# `--envs 0`: up to this many cars per process, the fastest K measured: `drive bench closedloop` (K = 64 drove 3-5 %
# more steps per CPU-s than 32; `drive eval --envs 128` no more than 64, for 1.77 GB resident against 1.22:
# docs/scale.md has both commands)
AUTO_ENVS = 64
# `drive collect --envs 0`: one car per process. The PPO expert acts on the 50-d state in ~10 us, so lanes have
# little to amortise, and stepping K envs in turn costs about as much again (each env's track, physics and geometry
# presumably evict the others' from the caches). `drive bench closedloop` times both (`--collect-envs 4`): 4 cars
# / 1 car 1.00x in two runs (docs/scale.md). One car per task also records nothing again after a kill
AUTO_COLLECT_ENVS = 1


def cars_per_process(envs: int, seeds: int, workers: int, most: int = AUTO_ENVS) -> int:
    """`--envs K` as given, or for 0 as many cars as each worker has seeds, at most `most` (so every worker gets
    a task: a process runs one task of K seeds at a time)."""
    return envs or max(1, min(most, -(-seeds // max(1, workers))))


def lane_copies(policy: Any, k: int) -> list[Any]:
    """`policy` and k - 1 independent copies of it (episode state, generators, gate) sharing its torch modules: the
    lanes of one process (drive/loop/rollout.py `run_lanes`), whose controller calls `act_lanes` batches."""
    shared: dict[int, Any] = {}
    stack, seen = [policy], set()
    while stack:  # every torch module reachable through attributes is shared, not copied
        obj = stack.pop()
        if id(obj) in seen:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.nn.Module):
            shared[id(obj)] = obj
        elif hasattr(obj, "__dict__") and not isinstance(obj, type):
            stack.extend(vars(obj).values())
    return [policy] + [copy.deepcopy(policy, dict(shared)) for _ in range(k - 1)]


def cached_lanes(
    cache: dict[Any, list[Any]], key: Any, k: int, policy: Callable[[], Any], lane: Callable[[Any], Any]
) -> list[Any]:
    """The first k lanes of one setting (`key`), built once per process: `policy()` makes the first lane's policy,
    `lane(policy)` a lane around it, and a task asking for more lanes than were built grows the list (a shorter last
    task reuses the first ones). `cache` holds one setting at a time."""
    if key not in cache:
        cache.clear()
        cache[key] = [lane(policy())]
    lanes = cache[key]
    if len(lanes) < k:
        lanes += [lane(p) for p in lane_copies(lanes[0].policy, k - len(lanes) + 1)[1:]]
    return lanes[:k]


def episodes_in(task: tuple) -> int:
    """How many episodes a lanes task (ARG, SETTINGS, SEEDS) holds: `run_tasks`'s progress counts episodes."""
    return len(task[2])
