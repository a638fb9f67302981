"""Every engine setting in one place: its default, its help text and its check.

`cobatch serve` builds one flag per field from this class (server/cli.py), so a setting is
written once. A field's metadata may name its flag (`flag`) and older spellings of it
(`aliases`), spell a switch `on`/`off`
(`on_off`), give the server its own default (`serve_default`), or read 0 on the command line as
None (`zero_is_none`). A switch gets both `--name` and `--no-name`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from bindings import LLAMA_MAX_SEQ
from engine.policy import FifoPolicy, SchedulingPolicy, TwoTierPolicy
from engine.step_cost import StepCostModel
from engine.tuning import IDLE_CELLS_PER_PROMPT_TOKEN_FLASH, IDLE_CELLS_PER_PROMPT_TOKEN_NO_FLASH


def setting(default: Any, help: str, **cli: Any) -> Any:
    return field(default=default, metadata={"help": help, **cli})


@dataclass(frozen=True)
class EngineConfig:
    """Engine settings. With the prefix cache on, Gemma 3's sliding-window layers keep their full
    cache (llama.cpp's swa_full): a reused prefix needs every one of its cells, not just the last
    window's, and a finished sequence's early cells would otherwise be gone."""

    n_ctx: int = setting(8192, "KV cache cells shared by all requests (one unified cache)")
    max_running: int = setting(32, "sequences generating at once (their rows share each decode step)",
                               aliases=("--max-batch",))
    step_token_budget: int = setting(
        256, "tokens per llama_decode: decoding rows first, then prompt chunks (at least --max-running)")
    n_threads: int = setting(
        max(1, os.cpu_count() or 1),
        "CPU threads (default: all cores; with --replicas N, the node's cores / N per replica)", flag="--threads",
        serve_default=None)
    # Another process on the cores makes ggml's threads wait for each other at every graph node.
    adaptive_threads: bool = setting(
        True, "measure step times and run fewer threads while that is faster (another process on the cores)")
    # At equal nice, a step's ggml threads and a thread with a moment's work (the first-token
    # lane's prompt, the HTTP loop) split a core evenly, and that moment takes twice as long. Off
    # by default: it also hands a share of the cores to a niced process in the same session.
    engine_nice: int = setting(
        0, "nice increment of the engine thread and the ggml threads it starts, against the process's other "
           "threads (the first-token lane, the HTTP server), which then get a core first while they have work: "
           "chats' first tokens beside batch work come sooner, but a niced busy process in the same session "
           "takes more of the cores (docs/threads.md; 0: same priority)")
    max_waiting: int = setting(1024, "queued batch requests before a 429")
    max_waiting_interactive: int = setting(256, "queued interactive requests before a 429")
    block_size: int = setting(16, "KV cells per block of the cache ledger (divides --n-ctx)")
    prefix_cache: bool = setting(True, "keep finished requests' prompt blocks for reuse")
    cache_holders: int = setting(
        64, f"seq ids reserved to hold cached prefixes (--max-running plus this at most {LLAMA_MAX_SEQ})")
    # Cached cells are not free: every decode step's attention spans the used cells of the cache.
    cache_max_fraction: float = setting(
        0.25, "share of KV cells idle cached prefixes may hold; with flash attention off every decode step "
              "attends over held cells, so a smaller share trades prefix hits for speed")
    # Neither setting makes a request's output independent of who else is running: a row's logits
    # change with how many rows its step holds (measured in docs/evaluation.md, bench/invariance.py).
    # The server turns it on, as llama-server does: the kernel skips the
    # cells a row's mask hides, so other requests' cells cost a step almost nothing.
    flash_attn: bool = setting(False, "llama.cpp's flash attention", flag="--flash-attn", on_off=True,
                               serve_default=True)
    priority_scheduling: bool = setting(True, "two priority tiers (off: one FIFO queue, request priority ignored)",
                                        flag="--priority")
    batch_min_share: float = setting(0.25, "share of slots, prompt tokens and steps batch work always keeps")
    # Off is the same-run baseline of `cobatch bench tenants`: one script's flood then takes a tier.
    fair_share: bool = setting(
        True, "within each tier, admit first from the waiting tenant (API key) with the least service per unit "
              "of weight, tokens counted as computed (off: first come, first served; docs/tenants.md)",
        on_off=True)
    # Aborting later wastes more batch work than it saves: the step's last part, the output
    # projection, cannot be aborted by llama.cpp, so a late abort only discards a finished step.
    interrupt_window: float = setting(
        0.5, "an interactive arrival aborts a step of batch work (decode rows or prompt chunks) that has run "
             "less than this fraction of a typical one of its kind (0: never); a step of prompt chunks alone, "
             "whose end can be aborted, until at least 0.9 of one")
    # An interactive token waits for one step, whose time grows with its rows: the target says how
    # long that may be, and batch work gets whatever rows and prompt tokens fit in it.
    interactive_token_ms: float | None = setting(
        150.0, "per-token latency target for interactive requests while batch work runs: each step carries "
               "the batch rows that fit (0: no target)", zero_is_none=True)
    interactive_batch_rows: int | None = setting(
        None, "while interactive requests decode, batch tokens per step at most, on top of the target "
              "(rows rotate; 0: no cap)", zero_is_none=True)
    # The step in flight ends with the output projection of its rows, which cannot be aborted;
    # on one thread beside it, a short prompt's first token comes sooner than after it.
    first_token_lane_tokens: int = setting(
        32, "an interactive request that arrives while the engine is busy, with a prompt of at most this many "
            "tokens, gets its first token from a small one-thread context beside the main one (0: off)")
    # Idle cached cells slow every prompt row a little (attention reads their mask); this is the
    # exchange rate that decides when they are dropped before a long prefill (engine/prefix_reuse.py).
    idle_cells_per_prompt_token: float | None = setting(
        None, "idle cached KV cells that cost a prefill as much as one more prompt token; past that, weighed "
              "against the measured cache hit share, idle cached prefixes are dropped before a long prefill "
              f"(0: what Gemma 3 270M measures, {IDLE_CELLS_PER_PROMPT_TOKEN_FLASH:,} with flash attention, "
              f"{IDLE_CELLS_PER_PROMPT_TOKEN_NO_FLASH:,} without; `cobatch bench idle-cells` measures another model)",
        zero_is_none=True)
    # Drafts cost batch rows: they are verified only where the step-cost model says they pay.
    speculative: bool = setting(
        True, "speculative decoding: tokens guessed from the sequence's own earlier text and recent outputs (and by "
              "--draft-model, if given) are verified in the step, where the step-cost model says they pay (greedy outputs "
              "unchanged, sampled ones in distribution)", on_off=True, words=("auto", "off"))
    speculative_max_draft: int = setting(31, "drafted tokens per sequence and step at most")
    # A draft model's decodes run between the main steps and are not weighed by the allotment:
    # only a model several times smaller than the main one can pay for them (docs/speculative-decoding.md).
    draft_model: str | None = setting(
        None, "GGUF file (or owner/repo/file.gguf on Hugging Face) of a smaller model with the same vocabulary: "
              "it drafts, in its own context, for sequences the model-free drafts have nothing for")
    jump_forward: bool = setting(
        True, "where a JSON schema allows one continuation only, append its tokens unsampled")

    def __post_init__(self) -> None:
        if self.n_ctx < 64:
            raise ValueError(f"n_ctx must be at least 64, got {self.n_ctx}")
        if not 0 <= self.engine_nice <= 19:
            raise ValueError(f"engine_nice must be between 0 and 19, got {self.engine_nice}")
        if not 1 <= self.max_running < LLAMA_MAX_SEQ:
            raise ValueError(f"max_running must be between 1 and {LLAMA_MAX_SEQ - 1}, got {self.max_running}")
        if self.step_token_budget < self.max_running:
            raise ValueError(
                "step_token_budget must be at least max_running, so every running sequence can "
                f"decode each step (got {self.step_token_budget} < {self.max_running})"
            )
        if self.n_threads < 1:
            raise ValueError(f"n_threads must be >= 1, got {self.n_threads}")
        if self.block_size < 1 or self.n_ctx % self.block_size:
            raise ValueError(f"block_size must divide n_ctx, got {self.block_size} for {self.n_ctx}")
        if self.cache_holders < 0 or self.max_running + self.cache_holders > LLAMA_MAX_SEQ:
            raise ValueError(f"cache_holders must be >= 0 and max_running + cache_holders <= {LLAMA_MAX_SEQ}, "
                             f"got {self.cache_holders} with max_running {self.max_running}")
        if not 0.0 <= self.interrupt_window <= 1.0:
            raise ValueError(f"interrupt_window must be between 0 and 1, got {self.interrupt_window}")
        if not 0 <= self.first_token_lane_tokens <= self.n_ctx:
            raise ValueError(f"first_token_lane_tokens must be between 0 and n_ctx, got {self.first_token_lane_tokens}")
        if not 0.0 <= self.cache_max_fraction <= 1.0:
            raise ValueError(f"cache_max_fraction must be between 0 and 1, got {self.cache_max_fraction}")
        if self.idle_cells_per_prompt_token is not None and not self.idle_cells_per_prompt_token > 0:
            raise ValueError(f"idle_cells_per_prompt_token must be positive, got {self.idle_cells_per_prompt_token}")
        if self.speculative_max_draft < 1:
            raise ValueError(f"speculative_max_draft must be >= 1, got {self.speculative_max_draft}")
        if self.draft_model is not None and not self.speculative:
            raise ValueError("draft_model needs speculative auto (it is off)")
        if self.draft_model is not None and not str(self.draft_model).strip():
            raise ValueError("draft_model must name a GGUF file")
        if self.max_waiting < 1 or self.max_waiting_interactive < 1:
            raise ValueError("max_waiting and max_waiting_interactive must be >= 1")
        self.scheduling_policy()  # the policy checks its own settings

    @property
    def idle_cells_rate(self) -> float:
        """idle_cells_per_prompt_token, or the measured rate for this attention setting."""
        if self.idle_cells_per_prompt_token is not None:
            return self.idle_cells_per_prompt_token
        return IDLE_CELLS_PER_PROMPT_TOKEN_FLASH if self.flash_attn else IDLE_CELLS_PER_PROMPT_TOKEN_NO_FLASH

    @property
    def sequence_ids(self) -> int:
        """Seq ids for sequences that hold KV cells: the running ones, and up to as many again
        for batch sequences suspended to make room for interactive ones (the prefix cache's
        holders take theirs from the same llama.cpp limit)."""
        holders = self.cache_holders if self.prefix_cache else 0
        return max(self.max_running, min(2 * self.max_running, LLAMA_MAX_SEQ - holders))

    def scheduling_policy(self, step_cost: StepCostModel | None = None) -> SchedulingPolicy:
        """A new policy object (it keeps per-engine state); `step_cost` is the engine's own model of
        its step times, without which the latency target cannot be planned for."""
        if not self.priority_scheduling:
            return FifoPolicy()
        target_s = None if self.interactive_token_ms is None else self.interactive_token_ms / 1000.0
        return TwoTierPolicy(self.max_running, self.step_token_budget, self.batch_min_share, self.interrupt_window > 0,
                             self.interactive_batch_rows, target_s, step_cost, fair_share=self.fair_share)
