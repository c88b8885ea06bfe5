# train_step_bench: CPU engine training step (GPT-2 124M and a small config)
# vs the sgemm peak and, with --peer torch, PyTorch (train_step_bench.py).
add_executable(train_step_bench ${CMAKE_CURRENT_LIST_DIR}/train_step_bench.cc)
target_link_libraries(train_step_bench PRIVATE shardtrain_engine_cpu shardtrain_optim)
target_compile_options(train_step_bench PRIVATE -O3 -march=native)
target_compile_definitions(train_step_bench PRIVATE
  SHARDTRAIN_BENCH_TORCH_SCRIPT="${CMAKE_CURRENT_LIST_DIR}/train_step_bench.py")
