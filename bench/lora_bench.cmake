# lora_bench: a LoRA fine-tuning step next to a full fine-tuning step of the
# same model (one CPU rank, the real Trainer: forward, backward, AdamW), as a
# ratio, with each run's memory. Not a test.
if(TARGET shardtrain_worker_core)
  add_executable(lora_bench ${CMAKE_CURRENT_LIST_DIR}/lora_bench.cc)
  target_link_libraries(lora_bench PRIVATE shardtrain_worker_core CLI11::CLI11)
endif()
