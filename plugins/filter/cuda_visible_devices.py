# Copyright: (c) 2025, llmops.inference contributors
# GNU General Public License v3.0+ (see https://www.gnu.org/licenses/gpl-3.0.txt)
# SPDX-License-Identifier: GPL-3.0-or-later

from __future__ import annotations

from ansible.errors import AnsibleFilterError

from ansible_collections.llmops.inference.plugins.module_utils.gpu import cuda_visible_devices as _cuda_visible_devices

DOCUMENTATION = r"""
name: cuda_visible_devices
short_description: The C(CUDA_VISIBLE_DEVICES) entries for a GPU list, GPU UUIDs resolved to indexes
version_added: 0.1.0
description:
  - Returns the GPU list with each whole GPU given by its index, so that SGLang's custom all-reduce can read it
    (it parses C(CUDA_VISIBLE_DEVICES) with C(int()) and falls back to NCCL's all-reduce on a UUID). MIG devices keep
    their UUIDs.
  - The indexes are the host's, as M(llmops.inference.sglang_info) reports the devices of the list (its
    RV(llmops.inference.sglang_info#module:gpus.devices)); with C(CUDA_DEVICE_ORDER=PCI_BUS_ID), CUDA numbers GPUs as
    NVML does.
  - Without the devices, or when they do not match the list one for one, the list is returned unchanged.
author:
  - llmops.inference contributors
options:
  _input:
    description: The GPU list (indexes, C(GPU-) or C(MIG-) UUIDs).
    type: list
    elements: raw
    required: true
  devices:
    description:
      - The devices the list names, in its order, each with C(index), C(uuid) and, for a MIG device, C(mig_index).
    type: list
    elements: dict
    required: true
"""

EXAMPLES = r"""
- name: Look up the engine's GPUs on this host
  llmops.inference.sglang_info:
    gpus:
      devices: "{{ sglang_service_gpus }}"
  register: gpu_check

- name: CUDA_VISIBLE_DEVICES for the engine
  ansible.builtin.debug:
    msg: >-
      CUDA_VISIBLE_DEVICES={{ sglang_service_gpus
      | llmops.inference.cuda_visible_devices(gpu_check.gpus.devices) | join(',') }}
  # With sglang_service_gpus ['GPU-3b1c0f1e-0000-4000-8000-000000000000', '3'], that UUID being the host's GPU 2:
  # CUDA_VISIBLE_DEVICES=2,3
"""

RETURN = r"""
_value:
  description: The entries, as strings, in the list's order; join them with commas for C(CUDA_VISIBLE_DEVICES).
  type: list
  elements: str
  sample: ["2", "3"]
"""


def cuda_visible_devices(selectors, devices) -> list:
    if isinstance(selectors, (str, bytes)) or not isinstance(selectors, (list, tuple)):
        raise AnsibleFilterError(f"cuda_visible_devices expects a list of GPUs, got {type(selectors).__name__}")
    try:
        return _cuda_visible_devices(selectors, devices)
    except (KeyError, TypeError, AttributeError) as exc:
        raise AnsibleFilterError(f"cuda_visible_devices: devices must be dicts with index and uuid ({exc})") from None


class FilterModule:
    def filters(self):
        return {"cuda_visible_devices": cuda_visible_devices}
