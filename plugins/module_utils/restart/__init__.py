# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later
"""The restart chain of an SGLang unit, the logic of the sglang_restart module.

Private to the llmops.inference collection; not a public API.

- options.py: the module's argument spec (every option and default, written there only), ChainOptions, the checks;
- runners.py: every effect on the host (systemctl, the reaper, the probe, the engine's endpoints, the lock);
- gate.py: the wait until the unit is ready, the probe's tiers and the stability window;
- result.py: the steps and what the chain found, rendered as the module's result, message and diff;
- chain.py: the orchestration; plan.py: what a check-mode run would do.
"""
