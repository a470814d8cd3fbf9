"""The engine facade: one `step()` = schedule, draft, one target forward, verify, commit.

Driven from a single thread (the Kafka worker's engine loop); nothing here is
thread-safe and nothing here knows about Kafka.

A step:
1. the speculation controller picks a draft length k_i per decoding sequence;
2. the scheduler builds the batch (decodes first, then prefill chunks) and
   drops aborted / expired requests;
3. the proposer drafts up to k_i tokens per scheduled decode;
4. ONE target forward over the flat batch: a decode feeds [last, d_1..d_k]
   and gets k + 1 rows of logits, a prefill chunk that completes its prompt
   gets its last row;
5. constrained sequences get their rows masked by their grammar (drafts it
   refuses were cut in 3), then the verifier turns each sequence's rows into 1..k+1 tokens (accepted
   drafts plus one token of the target's own; with k = 0 this is plain
   sampling), the scheduler moves each KV counter past the accepted prefix
   (rejected drafts cost nothing to drop), and the controller learns what was
   accepted;
6. tokens go through the finish checks (EOS, stop strings, max_tokens) and
   the detokenizer (engine.commit); finished requests free their KV region at once;
7. step observers, if any, get a record of the step (engine.step_record).
"""
from __future__ import annotations

import time

from engine.commit import Committer, final_output
from engine.config import EngineConfig
from engine.detokenizer import IncrementalDetokenizer
from engine.engine_setup import (
    Progress,
    build_kv_cache,
    build_proposer,
    load_configured_adapters,
    no_progress,
    resolve_max_model_len,
)
from engine.grammar.matchers import ConstrainedRows, Matchers
from engine.fused.decoder_step import FusedDecoderStep
from engine.fused.row_attention import install_row_attention
from engine.fused.norm import install_norm_kernel
from engine.kernel_dispatch import dispatch_kernels
from engine.kv_cache import CacheUsage, region_size
from engine.loader import LoadedModel, load_model
from engine.logits_processors import SequenceRows, out_of_vocabulary, process_
from engine.logprobs import RawLogprobs, prompt_entries
from engine.model_ref import cache_root
from engine.lora.manager import LoRAManager
from engine.lora.requests import LoRARequests
from engine.outputs import PrefixCacheCounters, RequestOutput, RequestOutputAccum, SpecCounters
from engine.quant.apply import resident_line
from engine.quant.formats import REDUCED_FORMATS
from engine.quant.linear import bf16_piece_rows
from engine.request import EngineRequest, RequestRejected
from engine.runner import ModelRunner, RunnerOutput
from engine.sampler import RequestRng
from engine.scheduler import ScheduledSequence, Scheduler, SchedulerOutput, draft_cap, draft_room
from engine.sequence import Sequence
from engine.speculative.controller import SpeculationController
from engine.speculative.proposer import (
    DraftProposal,
    DraftSources,
    FollowsWeightFormat,
    HiddenStateConsumer,
    LearnsFromOutputs,
    ProposalInput,
    Proposer,
)
from engine.speculative.verifier import verify_batch
from engine.step_record import StepObserver, StepRecord
from engine.threads import apply_threads
from engine.weight_plan import WeightRequest, apply_weights


def _grammatical(seq: Sequence, proposal: DraftProposal) -> DraftProposal:
    """The proposal cut at its first draft the sequence's grammar refuses (the target could never accept it)."""
    if seq.matcher is None:
        return proposal
    n = Matchers.valid_drafts(seq.matcher, proposal.tokens)
    if n == proposal.num_tokens:
        return proposal
    return DraftProposal(proposal.tokens[:n], None if proposal.probs is None else proposal.probs[:n])


def _first_rows(with_logits: list[ScheduledSequence]) -> list[int]:
    """Each sequence's first row in the step's logits: 1 + k rows per sequence (k = 0 for a prefill)."""
    starts, row = [], 0
    for s in with_logits:
        starts.append(row)
        row += 1 + len(s.draft_tokens)
    return starts


def _rows(sched: ScheduledSequence, first_row: int) -> SequenceRows:
    seq = sched.seq
    return SequenceRows(seq.params, seq.request.prompt_token_ids, seq.output_ids, sched.draft_tokens, first_row)


def _record_prompt_logprobs(scheduled: list[ScheduledSequence], result: RunnerOutput) -> None:
    """The prompt logprobs of this step's prefill chunks, for the sequences that asked (before their first output)."""
    for i, (pos, logits) in result.prompt_logits.items():
        seq = scheduled[i].seq
        following = seq.request.prompt_token_ids[pos + 1 : pos + 1 + logits.shape[0]]
        seq.prompt_logprobs.extend(prompt_entries(logits, following, seq.params.prompt_logprobs or 0))


def _proposal_input(seq: Sequence) -> ProposalInput:
    return ProposalInput(
        seq_id=seq.request_id,
        token_ids=seq.all_token_ids(),
        params=seq.params,
        num_prompt_tokens=seq.num_prompt_tokens,
        rng=seq.rng,
        scope=seq.request.draft_scope,
    )


class LLMEngine:
    def __init__(
        self,
        loaded: LoadedModel,
        config: EngineConfig,
        proposer: Proposer | None = None,
        controller: SpeculationController | None = None,
        progress: Progress | None = None,
    ) -> None:
        """Wire an already loaded model; `from_config` is the usual entry point.

        proposer / controller: injected for tests; by default built from
        config.speculation (no proposer when speculation is disabled).
        """
        say = progress or no_progress
        self.config = config
        self.model = loaded.model
        self.tokenizer = loaded.tokenizer
        self.model_name = config.model
        self.eos_token_ids = loaded.eos_token_ids
        self.vocab_size = loaded.model.cfg.vocab_size

        self.max_model_len = resolve_max_model_len(config.max_model_len, loaded.max_context)

        spec = config.speculation
        self.speculation_enabled = spec.enabled and spec.max_draft_tokens > 0
        self.max_draft_tokens = spec.max_draft_tokens if self.speculation_enabled else 0
        self.proposer: Proposer | None
        self.controller: SpeculationController | None
        if self.speculation_enabled:
            self.proposer = proposer or build_proposer(loaded, config, self.max_model_len, say)
            self.controller = controller or SpeculationController(spec)
        else:
            self.proposer, self.controller = None, None

        # RoPE tables for every position of the longest region: drafts may run past max_model_len - 1.
        self.model.init_rope(loaded.hf_config, region_size(self.max_model_len, self.max_draft_tokens))
        self.weight_format = apply_weights(loaded, config.weights, config.prepack_weights, say, config.quant_kernel,
                                           defer_wide=True)
        if isinstance(self.proposer, FollowsWeightFormat):  # a draft head: its weights in the target's format too
            self.proposer.follow_weight_format(self.weight_format, config.quant_kernel)
        # Which kernel each step size runs on this CPU (measured, or fixed): one line at start. Sized by the
        # configured k even with speculation off, so turning speculation on or off never changes the kernels.
        dispatch = dispatch_kernels(self.model, self.weight_format, config, spec.max_draft_tokens, cache_root().parent)
        if dispatch is not None:
            say(dispatch)
        if self.weight_format != "fp32":
            say(resident_line(self.model, self.weight_format))

        self.kv_cache = build_kv_cache(loaded, config, self.max_model_len, self.max_draft_tokens, self.weight_format)
        usage = self.kv_cache.usage()
        say(f"KV cache: {usage.total_tokens} tokens, {usage.total_bytes / 2**20:.0f} MiB, {self.kv_cache.dtype}")

        self.scheduler = Scheduler(
            self.kv_cache,
            max_model_len=self.max_model_len,
            max_running_requests=config.max_running_requests,
            max_batched_tokens=config.max_batched_tokens,
            max_draft_tokens=self.max_draft_tokens,
            batch_max_share=config.batch_max_share,
            batch_headroom=config.batch_headroom,
            batch_step_tokens=config.batch_step_tokens,
            prefix_caching=config.prefix_caching,
        )
        # A draft head reads the target's hidden states: only then does the runner keep them.
        self.hidden_consumer = self.proposer if isinstance(self.proposer, HiddenStateConsumer) else None
        self.runner = ModelRunner(self.model, self.kv_cache, keep_hidden=self.hidden_consumer is not None)
        # After the weight format: the LoRA delta wraps whatever linear the format installed.
        self.lora: LoRARequests | None = None
        if config.lora.enabled and self.model.cfg.num_experts and not config.lora.adapters:
            say(f"lora: off ({self.model.cfg.model_type}'s experts take no adapters yet)")  # only the default slots
        elif config.lora.enabled:
            self.lora = LoRARequests(LoRAManager(self.model, config.lora), self.scheduler.add, self.model_name)
            load_configured_adapters(self.lora.manager, config.lora, say)
        # Last: it reads the linears the weight format, the kernel dispatch and LoRA left.
        if config.fused_step and self.weight_format in REDUCED_FORMATS:
            say(install_row_attention(self.model))  # before the fused step, which attends as the layers do
            say(install_norm_kernel(self.model))  # ... and normalizes as they do
            self.model.fused_step, line = FusedDecoderStep.build(self.model)
            say(line)
        # Drafts never make a step's bf16 GEMMs take one more piece (engine.scheduler.draft_room).
        self.bf16_piece_rows = bf16_piece_rows(self.model)
        self.committer = Committer(self.scheduler, self.eos_token_ids, self.proposer, self.lora)
        self.matchers = Matchers(loaded.tokenizer, self.vocab_size, self.eos_token_ids)
        self.num_forwards = 0
        self._step_observers: list[StepObserver] = []

    @classmethod
    def from_config(cls, cfg: EngineConfig, progress: Progress | None = None) -> LLMEngine:
        if cfg.threads is not None:
            (progress or no_progress)(f"torch intra-op threads: {apply_threads(cfg.threads)}")
        # An EAGLE head binds the target's float embedding and LM-head rows (engine.speculative.eagle_head).
        eagle = cfg.speculation.enabled and cfg.speculation.method == "eagle"
        weights = WeightRequest(cfg.weights, cfg.quant_kernel, float_embedding=eagle)
        # RoPE tables for one position: the engine sizes them for its longest region (init_rope in __init__), and
        # load_model's default, the model's whole context, is 180 MB of tables for Gemma 3 only to be dropped.
        loaded = load_model(cfg.model, device=cfg.device, dtype=cfg.dtype, max_positions=1, progress=progress,
                            weights=weights)
        return cls(loaded, cfg, progress=progress)

    # ------------------------------------------------------------------ API

    def add_request(self, req: EngineRequest) -> None:
        """Queue a request; raises RequestRejected when it can never be served."""
        bad = [t for t in req.prompt_token_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RequestRejected(
                "invalid_request", f"prompt token id {bad[0]} is outside the vocabulary (0..{self.vocab_size - 1})"
            )
        outside = out_of_vocabulary(req.sampling, self.vocab_size)
        if outside is not None:
            raise RequestRejected("invalid_request", outside)
        speculate = self.speculation_enabled and req.speculation is not False
        seq = Sequence(request=req, speculate=speculate)
        seq.rng = RequestRng(req.sampling.seed)
        seq.detok = IncrementalDetokenizer(self.tokenizer, req.prompt_token_ids, req.sampling.stop)
        if req.constraint is not None:
            seq.matcher = self.matchers.new(req.constraint)
        if self.controller is not None and speculate:
            seq.spec_state = self.controller.new_state(req.request_id, req.speculation)
        if self.lora is not None:
            self.lora.admit(seq)
        elif req.lora is not None:
            raise RequestRejected("unknown_model", f"model '{req.lora}' is not served; available: {self.model_name}")
        else:
            self.scheduler.add(seq)

    def abort(self, request_id: str) -> RequestOutput | None:
        """Cancel a waiting or running request; its KV region is free when this returns."""
        seq = self.scheduler.abort(request_id)
        if seq is None and self.lora is not None:
            seq = self.lora.abort(request_id)
        if seq is None:
            return None
        self.committer.release(seq)
        return final_output(seq, [], "", SpecCounters())

    def learn_outputs(self, outputs: list[tuple[str, list[int]]]) -> int:
        """Past outputs generated elsewhere (scope, token ids), for a proposer that drafts from them (suffix
        decoding); how many it took: none without one. On the engine's thread, between steps."""
        if not isinstance(self.proposer, LearnsFromOutputs):
            return 0
        for scope, tokens in outputs:
            self.proposer.observe_finished("", tokens, scope)
        return len(outputs)

    def has_unfinished(self) -> bool:
        return self.scheduler.has_unfinished() or (self.lora is not None and bool(self.lora.parked))

    def cache_usage(self) -> CacheUsage:
        """KV held by running sequences (blocks only the prefix cache holds count as free, as vLLM counts them)."""
        return self.scheduler.blocks.usage()

    def prefix_cache_counters(self) -> PrefixCacheCounters:
        """Cumulative: prompt tokens looked up and found in the prefix cache (vLLM's prefix_cache_queries / _hits),
        and preemptions."""
        blocks = self.scheduler.blocks
        return PrefixCacheCounters(blocks.queries, blocks.hits, self.scheduler.num_preemptions)

    def add_step_observer(self, observer: StepObserver) -> None:
        """Call `observer` once per `step()`, after the step, with a StepRecord of it (empty steps included).

        Observers run on the engine's thread, in registration order, and their
        exceptions propagate out of `step()`: the step itself is complete (KV,
        scheduler and sequences moved on) but its outputs are lost to the
        caller, so an observer is for benchmarks and tests, not for serving.
        """
        self._step_observers.append(observer)

    def step(self) -> list[RequestOutput]:
        """One iteration; outputs of the requests that progressed or finished."""
        start = time.perf_counter()
        outputs = self._admit_adapter_requests()
        now = time.time()
        batch = self.scheduler.schedule(now, self._plan_drafts())
        outputs += [self.committer.expired(seq) for seq in batch.finished]
        if not batch.is_empty:
            outputs += self._run(batch)
        if self._step_observers:  # no record without an observer
            record = StepRecord.of(batch, start, time.perf_counter(), now, self.scheduler.is_batch)
            for observe in self._step_observers:
                observe(record)
        return outputs

    def _run(self, batch: SchedulerOutput) -> list[RequestOutput]:
        """Draft, one target forward, verify, commit: the outputs of the sequences that got tokens."""
        draft_s = self._propose(batch.scheduled)
        result = self._execute(batch)
        self.num_forwards += 1
        _record_prompt_logprobs(batch.scheduled, result)
        t0 = time.perf_counter()
        with_logits = [s for s in batch.scheduled if s.needs_logits]
        emitted, raw = self._verify(with_logits, result)
        verify_s = result.forward_s + time.perf_counter() - t0
        accepted = [len(tokens) - 1 for tokens in emitted]  # every step emits one token of the target's own
        accepted_by_id = {s.seq.request_id: a for s, a in zip(with_logits, accepted)}
        self._share_hidden(batch.scheduled, result, accepted_by_id)
        self.scheduler.update_from_step(batch, accepted_by_id)

        outputs: list[RequestOutput] = []
        for i, (sched, tokens, n_accepted) in enumerate(zip(with_logits, emitted, accepted)):
            now = time.time()
            if sched.seq.matcher is not None:
                Matchers.advance(sched.seq.matcher, tokens)
            self._learn(sched, n_accepted, draft_s, verify_s, now)
            step_spec = SpecCounters(len(sched.draft_tokens), n_accepted)
            outputs.append(self.committer.commit(sched.seq, tokens, step_spec, now, raw.of(i, tokens)))
        if self.controller is not None:
            drafted = sum(len(s.draft_tokens) for s in with_logits)
            self.controller.observe_step(batch.num_batched_tokens, verify_s, draft_s, drafted)
        return outputs

    def generate(self, requests: list[EngineRequest]) -> dict[str, RequestOutputAccum]:
        """Run requests to completion (tests, benchmarks); all are added up front."""
        acc = {r.request_id: RequestOutputAccum(r.request_id) for r in requests}
        for r in requests:
            self.add_request(r)
        while self.has_unfinished():
            for out in self.step():
                acc[out.request_id].add(out)
        return acc

    # ------------------------------------------------------------ LoRA

    def _admit_adapter_requests(self) -> list[RequestOutput]:
        """Between steps: swap in loaded adapters, let their parked requests in, fail those that cannot run."""
        if self.lora is None:
            return []
        self.lora.wait_if_idle(self.scheduler.has_unfinished())
        failed: list[RequestOutput] = []
        for f in self.lora.poll():
            out = final_output(f.seq, [], "", SpecCounters())
            out.error = (f.code, f.message)
            failed.append(out)
        return failed

    def _execute(self, batch: SchedulerOutput) -> RunnerOutput:
        """The target forward, each row with its request's adapter (a draft model's forwards never are)."""
        if self.lora is None:
            return self.runner.execute(batch)
        self.lora.begin_step(batch.scheduled)
        try:
            return self.runner.execute(batch)
        finally:
            self.lora.manager.end_step()

    # ------------------------------------------------------------ speculation

    def _plan_drafts(self) -> dict[str, int]:
        """The controller's k per speculating decode (only the positive ones)."""
        if self.controller is None:
            return {}
        decoding = [s for s in self.scheduler.decoding() if s.spec_state is not None]
        if not decoding:
            return {}
        # Tokens the step feeds anyway: one per decode plus what prefill can take.
        n_decode = len(self.scheduler.decoding())
        base = min(self.config.max_batched_tokens, n_decode + self.scheduler.pending_prefill_tokens())
        caps = [draft_cap(s, self.max_draft_tokens) for s in decoding]
        if isinstance(self.proposer, DraftSources):
            self._follow_sources(self.proposer, self.controller, decoding)
        ks = self.controller.plan([s.spec_state for s in decoding if s.spec_state is not None], base, caps,
                                  room=draft_room(base, self.bf16_piece_rows))
        return {s.request_id: k for s, k in zip(decoding, ks) if k > 0}

    @staticmethod
    def _follow_sources(proposer: DraftSources, controller: SpeculationController, decoding: list[Sequence]) -> None:
        """Point each sequence's spec_state at the state of the source that drafts for it this step; a source the
        controller switched off for the sequence leaves the step to the next one that would draft."""
        for seq in decoding:
            if seq.spec_state is None:
                continue
            skip = frozenset(name for name, st in seq.spec_states.items() if controller.resting(st))
            source = proposer.source(_proposal_input(seq), skip)
            if not seq.spec_states:  # the first step: the state add_request made becomes this source's
                seq.spec_states[source] = seq.spec_state
            state = seq.spec_states.get(source)
            if state is None:
                state = seq.spec_states[source] = controller.new_state(seq.request_id, seq.request.speculation)
            seq.spec_state = state

    def _source_of(self, seq: Sequence) -> str:
        """The source that drafted for the sequence this step: a combined proposer's (the one whose controller
        state is the sequence's now), or the method's name."""
        for name, state in seq.spec_states.items():
            if state is seq.spec_state:
                return name
        return self.config.speculation.method

    def _propose(self, scheduled: list[ScheduledSequence]) -> float:
        """Set the drafts of the scheduled decodes; returns the proposer's seconds."""
        todo = [s for s in scheduled if not s.is_prefill and s.draft_budget > 0]
        if self.proposer is None or not todo:
            return 0.0
        t0 = time.perf_counter()
        inputs = [_proposal_input(s.seq) for s in todo]
        for sched, proposal in zip(todo, self.proposer.propose(inputs, [s.draft_budget for s in todo])):
            sched.set_drafts(_grammatical(sched.seq, proposal))
        return time.perf_counter() - t0

    def _share_hidden(self, scheduled: list[ScheduledSequence], result: RunnerOutput, accepted: dict[str, int]) -> None:
        """Before the KV counters move: the hidden states of the rows that are now committed tokens
        (a prefill chunk's rows; a decode's last token and its accepted drafts) go to the draft head."""
        if self.hidden_consumer is None or result.hidden is None:
            return
        for sched, start in zip(scheduled, result.row_starts):
            if not sched.seq.speculate:
                continue
            kept = sched.num_new_tokens if sched.is_prefill else 1 + accepted.get(sched.seq.request_id, 0)
            hidden = result.hidden[start : start + kept]  # [kept, hidden]
            self.hidden_consumer.observe_hidden(sched.seq.request_id, sched.seq.num_computed, hidden)

    def _verify(self, with_logits: list[ScheduledSequence], result: RunnerOutput) -> tuple[list[list[int]], RawLogprobs]:
        """Per sequence needing logits, its emitted tokens (k = 0 is plain sampling), and the raw logprobs of the
        rows of those that asked for them (before any processing)."""
        firsts = _first_rows(with_logits)
        raw = RawLogprobs.capture(result.logits, {
            i: (first, 1 + len(s.draft_tokens), s.seq.params.logprobs)
            for i, (s, first) in enumerate(zip(with_logits, firsts)) if s.seq.params.logprobs is not None})
        if not with_logits:
            return [], raw
        constrained = [ConstrainedRows(s.seq.matcher, first, s.draft_tokens)
                       for s, first in zip(with_logits, firsts) if s.seq.matcher is not None]
        # The request's processors (penalties, bias, min_tokens) before the grammar's mask, which must win.
        process_(result.logits, [_rows(s, r) for s, r in zip(with_logits, firsts)], self.eos_token_ids)
        self.matchers.mask_(result.logits, constrained)  # [rows, V], in place
        return verify_batch(
            result.logits,
            [s.drafts for s in with_logits],
            [s.seq.params for s in with_logits],
            [s.seq.rng for s in with_logits],
            [len(s.seq.output_ids) for s in with_logits],
        ), raw

    def _learn(self, sched: ScheduledSequence, accepted: int, draft_s: float, verify_s: float, now: float) -> None:
        """Per-sequence bookkeeping of one verification: timing, counters, the controller's estimate."""
        seq, k = sched.seq, len(sched.draft_tokens)
        seq.num_sampling_forwards += 1
        if seq.first_token_time is None:
            seq.first_token_time = now
        if k == 0:
            return
        seq.spec.record(k, accepted, draft_s, verify_s, self._source_of(seq))
        if self.controller is not None and seq.spec_state is not None:
            self.controller.observe_acceptance(seq.spec_state, k, accepted)
