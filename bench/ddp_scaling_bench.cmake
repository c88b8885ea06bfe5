# ddp_scaling_bench: the trainer on 1 rank x 2 threads vs 2 ranks x 1 thread
# (forked processes, Gloo) vs PyTorch DDP (ddp_torch_peer.py). A benchmark,
# not a test.
if(TARGET shardtrain_worker_core)
  add_executable(ddp_scaling_bench ${CMAKE_CURRENT_LIST_DIR}/ddp_scaling_bench.cc)
  target_link_libraries(ddp_scaling_bench PRIVATE shardtrain_worker_core CLI11::CLI11)
  target_compile_definitions(ddp_scaling_bench PRIVATE
    SHARDTRAIN_BENCH_DDP_TORCH_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/ddp_torch_peer.py")
endif()
