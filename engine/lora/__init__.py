"""LoRA adapters on the target model: PEFT files in, per-row deltas in mixed batches out.

* `adapter`: reading and checking one PEFT adapter folder against the base model;
* `layers`: the stacked adapter weights of one fused linear and the gathered delta;
* `requests`: requests on their way in (refused, parked while their adapter loads, pinned);
* `manager`: slots (sized by engine.config.LoRAConfig, the `engine.lora` settings), the name registry, LRU
  eviction, off-thread loads swapped in between steps.
"""
