"""The bench tests' fixtures: a tiny random Llama target and an untrained EAGLE-3 draft saved for it."""

from tests.helpers.tiny_bench import draft_dir, one_cpu_thread, tiny_target, two_prompts

__all__ = ["draft_dir", "one_cpu_thread", "tiny_target", "two_prompts"]
