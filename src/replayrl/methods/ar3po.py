"""AR3PO (Zhang et al., arXiv 2509.25808): adaptive rollout and response reuse.

GRPO spends G responses on every prompt, and a group whose responses are all right or all
wrong has zero advantage. AR3PO attacks both ends:

* adaptive rollout (sec. 3, "adaptive rollout"): responses are generated in rounds of k
  (here rollout.num_generations) per prompt; after each round a prompt that already has a
  correct response stops receiving more, the others get another k, up to `max_rounds`
  rounds. Easy prompts cost k responses, hard ones up to max_rounds x k. The rule is the pure
  function `round_allocation`.
* response reuse (sec. 3, "response reuse"): a prompt that still has no correct response
  after the last round gets a correct response generated for it at an earlier step, from a
  per-prompt store (`CorrectResponseStore`), so its group has reward variance and a
  gradient. The rule is the pure function `responses_to_reuse`.

The pieces compose as any batch source: `round_allocation` is the rollout allocator,
`CorrectResponseStore` the store, `Ar3poSource` the batch source that drives the rounds
through the run's producer (`produce(..., rows=...)` with the latest call's rows) and trains
every response of the step's rounds plus the reused ones.

Choices the parts of the paper we could read leave open, marked "not specified: our choice"
where they are made and configurable in `method.ar3po`: the number of rounds, how many
correct responses stop a prompt (the paper: one), how many stored responses are kept and
reused, and the reused response's old log-probs (`reuse_logprobs`). A prompt's advantages are
computed once, over all its rounds' responses plus the reused ones (GRPO's group
normalisation, `algorithm.scale_rewards`), so a group of n wrong answers and one reused right
one gets A = (r - mean) / std over n + 1 members.

Accounting: every round's responses are generated (`rollouts_generated`, the extra calls in
`generation_rounds`) and trained through the run's on-policy queue (pushed, consumed); reused
responses are counted in `rollouts_reused` per pass, never as generated; the store holds
references to rollouts already trained on, so it is not a ledger buffer.
"""

from __future__ import annotations

import dataclasses
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import Field

from replayrl.algorithms.advantages import group_advantages
from replayrl.config.section import Section
from replayrl.data.buffer import Buffer
from replayrl.data.buffer.base import decode_rollouts, encode_rollouts
from replayrl.data.groups import split_groups
from replayrl.data.rollout_record import Rollout
from replayrl.methods.base import GROUP_STRIDE, SourceContext
from replayrl.methods.grouped import GroupSource, Production

if TYPE_CHECKING:
    from replayrl.config.schema import Config


class Ar3poConfig(Section):
    """AR3PO (arXiv 2509.25808; methods/ar3po.py): adaptive rollout in rounds of
    rollout.num_generations responses per prompt, and reuse of a stored correct response for
    a group with none."""

    # rounds per step, the loop's first call included: a prompt gets at most
    # max_rounds x rollout.num_generations responses (the paper's cap on stages; its value
    # here is not specified: our choice)
    max_rounds: int = Field(4, ge=1)
    # a prompt stops receiving responses once it has this many correct ones (the paper: one)
    stop_correct: int = Field(1, ge=1)
    # stored correct responses reused per group without a correct one; 0 = adaptive rollout only
    reuse: int = Field(1, ge=0)
    # correct responses kept per prompt (newest kept) and prompts kept (least recently
    # updated dropped first). Not specified: our choice
    store_per_prompt: int = Field(1, ge=1)
    store_prompts: int = Field(
        10_000, ge=1, description="prompts whose correct responses are kept (LRU beyond)"
    )
    # a reused response's old log-probs: current = the policy's at the step it is reused
    # (ratio 1 at the first pass, trained as if pi_old had sampled it); behaviour = those
    # stored when it was generated (true importance ratio, clipped as any token). Not
    # specified in what we could read of the paper: our choice, configurable
    reuse_logprobs: Literal["current", "behaviour"] = "current"


# (version, step, group_base, prompt texts again, completions per prompt) -> Production
ProduceAgain = Callable[[int, int, int, list[str], int], Production]


def round_allocation(
    correct: Sequence[int],
    generated: Sequence[int],
    per_round: int,
    stop_correct: int,
    max_responses: int,
) -> list[int]:
    """Responses each prompt gets in the next round (arXiv 2509.25808, adaptive rollout: a
    prompt keeps being sampled, k responses a round, until it has a correct response or its
    budget is spent): `per_round` for a prompt with fewer than `stop_correct` correct
    responses whose `generated` + `per_round` stays within `max_responses`; 0 otherwise."""
    if len(correct) != len(generated):
        raise ValueError(f"{len(correct)} correct counts but {len(generated)} generated counts")
    if per_round < 1 or stop_correct < 1:
        raise ValueError(f"per_round={per_round} and stop_correct={stop_correct} must be >= 1")
    return [
        per_round if c < stop_correct and n + per_round <= max_responses else 0
        for c, n in zip(correct, generated, strict=True)
    ]


def responses_to_reuse(num_correct: int, stored: Sequence[Rollout], reuse: int) -> list[Rollout]:
    """Stored responses a group gets (arXiv 2509.25808, response reuse: a prompt whose
    responses are all wrong gets a previously generated correct one): the newest `reuse` of
    `stored` (newest last) when the group has no correct response, none otherwise. How many
    and which: not specified: our choice (`method.ar3po.reuse`, newest first)."""
    if reuse < 0:
        raise ValueError(f"reuse={reuse} must be >= 0")
    if num_correct > 0 or reuse == 0:
        return []
    return list(stored[-reuse:])


def regroup(members: Sequence[Rollout], group_id: int, scale_rewards: bool) -> None:
    """One prompt's final group, all rounds and reused responses together: one group id and
    GRPO's group-normalised advantage over every member (`group_advantages`), set in place."""
    rewards = torch.tensor([r.reward for r in members], dtype=torch.float64)
    adv, means = group_advantages(rewards, torch.zeros(len(members)), scale_rewards)
    for r, a, m in zip(members, adv.tolist(), means.tolist(), strict=True):
        r.group_id, r.advantage, r.group_mean_reward = group_id, float(a), float(m)


class CorrectResponseStore:
    """Per prompt text, its newest `per_prompt` correct responses (newest last); at most
    `max_prompts` prompts, the least recently updated dropped first (not specified: our
    choice). Holds references to rollouts already trained on: reuse, not generation."""

    kind = "ar3po_store"

    def __init__(self, per_prompt: int, max_prompts: int) -> None:
        if per_prompt < 1 or max_prompts < 1:
            raise ValueError(f"per_prompt={per_prompt}, max_prompts={max_prompts}: must be >= 1")
        self.per_prompt, self.max_prompts = per_prompt, max_prompts
        self._by_prompt: OrderedDict[str, list[Rollout]] = OrderedDict()
        self.added = self.reused = self.dropped = 0

    def __len__(self) -> int:
        return sum(len(v) for v in self._by_prompt.values())

    def get(self, prompt_text: str) -> list[Rollout]:
        return list(self._by_prompt.get(prompt_text, []))

    def add(self, rollouts: Sequence[Rollout]) -> None:
        """Keep the correct ones among `rollouts` (in order: the last is the newest)."""
        for r in rollouts:
            if not r.correct:
                continue
            kept = self._by_prompt.setdefault(r.prompt_text, [])
            kept.append(r)
            self.added += 1
            self.dropped += max(0, len(kept) - self.per_prompt)
            del kept[: max(0, len(kept) - self.per_prompt)]
            self._by_prompt.move_to_end(r.prompt_text)
            while len(self._by_prompt) > self.max_prompts:
                self.dropped += len(self._by_prompt.popitem(last=False)[1])

    def stats(self) -> dict[str, float]:
        return {
            "prompts": float(len(self._by_prompt)),
            "responses": float(len(self)),
            "added": float(self.added),
            "reused": float(self.reused),
            "dropped": float(self.dropped),
        }

    def state_dict(self) -> dict[str, Any]:
        table, order = encode_rollouts(r for v in self._by_prompt.values() for r in v)
        return {
            "per_prompt": self.per_prompt,
            "prompts": list(self._by_prompt),
            "sizes": [len(v) for v in self._by_prompt.values()],
            "rollouts": table,
            "order": order,
            "counters": [self.added, self.reused, self.dropped],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        flat = decode_rollouts(state["rollouts"], state["order"])
        self._by_prompt, at = OrderedDict(), 0
        for p, k in zip(state["prompts"], state["sizes"], strict=True):
            self._by_prompt[str(p)] = flat[at : at + int(k)]
            at += int(k)
        self.added, self.reused, self.dropped = (int(x) for x in state["counters"])


class Ar3poSource(GroupSource):
    """AR3PO's batch: the loop's first call is round 1 (k = rollout.num_generations per
    prompt); rounds 2..max_rounds generate k more for the prompts `round_allocation` keeps;
    a prompt still without a correct response gets `responses_to_reuse` from the store; every
    prompt's group is regrouped (`regroup`) and trained, `epochs` passes.

    `produce(version, step, group_base, texts, k)` generates k more completions for the
    latest call's prompts `texts` with the current weights (the run's producer); None (a unit
    test's source): one round only.
    """

    def __init__(
        self,
        buffer: Buffer,
        produce: ProduceAgain | None,
        store: CorrectResponseStore,
        per_round: int,
        prompts_per_call: int,
        epochs: int,
        scale_rewards: bool,
        ar: Ar3poConfig,
    ) -> None:
        super().__init__(buffer, epochs)
        self.produce, self.store, self.ar = produce, store, ar
        self.per_round, self.prompts_per_call = per_round, prompts_per_call
        self.scale_rewards = scale_rewards

    def _round(self, version: int, rnd: int, texts: list[str]) -> tuple[int, list[Rollout]]:
        """Round `rnd` (>= 1 after the loop's first) for `texts`, accounted like the first:
        (its group base, its rollouts)."""
        c, produce = self.bound, self.produce
        assert produce is not None
        base = c.step * GROUP_STRIDE + rnd * self.prompts_per_call
        p = self.generate(lambda: produce(version, c.step, base, texts, self.per_round))
        return base, p.rollouts

    def _rounds(self, fresh: list[Rollout], version: int) -> list[list[Rollout]]:
        """Every prompt's responses over the step's rounds (the first is the loop's call)."""
        members = [list(g.rollouts) for g in split_groups(fresh)]
        texts = [m[0].prompt_text for m in members]
        generated = [self.per_round] * len(members)
        # the one limit on rounds: a prompt's budget of max_rounds rounds of k responses
        cap = self.ar.max_rounds * self.per_round
        rnd = 0
        while True:
            correct = [sum(r.correct for r in m) for m in members]
            alloc = round_allocation(correct, generated, self.per_round, self.ar.stop_correct, cap)
            active = [i for i, n in enumerate(alloc) if n]
            if not active or self.produce is None:
                break
            rnd += 1
            base, more = self._round(version, rnd, [texts[i] for i in active])
            for i in active:
                generated[i] += self.per_round
            for r in more:  # the call's prompt index j is active[j] (all fit in round 1)
                members[active[r.group_id - base]].append(r)
        return members

    def _reuse(self, members: list[list[Rollout]]) -> list[Rollout]:
        """The reused copies for prompts without a correct response, appended to `members`."""
        copies: list[Rollout] = []
        for m in members:
            picked = responses_to_reuse(
                sum(r.correct for r in m), self.store.get(m[0].prompt_text), self.ar.reuse
            )
            for old in picked:
                old.times_sampled += 1
                new = dataclasses.replace(old, extras=dict(old.extras))
                m.append(new)
                copies.append(new)
        if copies and self.ar.reuse_logprobs == "current" and self.learner is not None:
            for r, lp in zip(copies, self.learner.current_logprobs(copies), strict=True):
                r.behaviour_logprobs = lp.detach().float().cpu()
                # the old sampler's log-probs no longer pair with these: truncated IS would
                # weigh the current policy against the old sampler. Without them the weight
                # is 1, as for a rollout whose pi_old is its sampler (`behaviour` keeps both)
                r.extras.pop("sampler_logprobs", None)
        self.store.reused += len(copies)
        return copies

    def next_batch(self, fresh: list[Rollout], version: int) -> tuple[list[Rollout], int]:
        c = self.bound
        members = self._rounds(fresh, version)
        generated = [r for m in members for r in m]
        copies = self._reuse(members)
        for m in members:
            regroup(m, m[0].group_id, self.scale_rewards)
        self.store.add(generated)  # after the look-ups: reuse is of earlier steps' responses
        batch = self.train_fresh(generated, version)
        c.add("rollouts_reused", len(copies) * self.epochs)
        return batch + copies, self.epochs

    # the store holds trained rollouts again: reuse, not the ledger (buffers(): the queue)

    def parts(self) -> dict[str, Any]:
        return {"ar3po_store": self.store}


# -- registry entry (methods/__init__.py) -----------------------------------------------


def check_ar3po(cfg: Config) -> None:
    a, r = cfg.method.section("ar3po"), cfg.rollout
    most = r.prompts_per_step * (a.max_rounds * r.num_generations + a.reuse)
    if a.reuse > a.store_per_prompt:
        raise ValueError(
            f"method.ar3po.reuse={a.reuse} is more than the {a.store_per_prompt} correct "
            "responses kept per prompt (method.ar3po.store_per_prompt): at most that many "
            "could be reused; raise store_per_prompt or lower reuse"
        )
    if cfg.train.batch_size is not None:
        raise ValueError(
            f"train.batch_size={cfg.train.batch_size}: AR3PO trains on every response of "
            "the step's rounds plus reused ones (leave train.batch_size unset)"
        )
    cap = cfg.buffer.capacity
    if isinstance(cap, int) and cap < most:
        raise ValueError(
            f"buffer.capacity={cap} is smaller than the {most} rollouts an AR3PO step can "
            "train on (prompts_per_step x (max_rounds x num_generations + reuse))"
        )
    if a.max_rounds * r.prompts_per_step >= 1_000_000:
        raise ValueError("method.ar3po.max_rounds x prompts_per_step >= 1e6")


def build_ar3po(ctx: SourceContext) -> Ar3poSource:
    """Rounds of rollout.num_generations responses through the run's producer (for the
    latest call's rows again), a per-prompt store of correct responses."""
    cfg, ar, producer = ctx.cfg, ctx.section("ar3po"), ctx.producer

    def again(version: int, step: int, base: int, texts: list[str], k: int) -> Production:
        assert producer is not None  # passed on only with a producer (below)
        return producer.produce(
            version, step, base, rows=[producer.rows_by_text[t] for t in texts], num_generations=k
        )

    return Ar3poSource(
        ctx.buffer,
        None if producer is None else again,
        CorrectResponseStore(ar.store_per_prompt, ar.store_prompts),
        cfg.rollout.num_generations,
        cfg.rollout.prompts_per_step,
        cfg.train.epochs,
        cfg.algorithm.scale_rewards,
        ar,
    )
