# gpu_train_bench: GPT-2 124M bf16 on one GPU through the Trainer, next to
# PyTorch eager / torch.compile on the same GPU (gpu_train_torch_peer.py).
# Exits 0 saying so without a device. Not a test.
if(TARGET shardtrain_engine_cuda_gpt)
  add_executable(gpu_train_bench ${CMAKE_CURRENT_LIST_DIR}/gpu_train_bench.cc
                 ${CMAKE_CURRENT_LIST_DIR}/ncu_summary.cc)
  target_link_libraries(gpu_train_bench PRIVATE shardtrain_worker_core shardtrain_device_probe
                        CUDA::cudart CLI11::CLI11)
  target_compile_definitions(gpu_train_bench PRIVATE
    SHARDTRAIN_FORTUNES_PATH="${CMAKE_SOURCE_DIR}/data/fortunes.txt"
    SHARDTRAIN_BENCH_DIR="${CMAKE_CURRENT_LIST_DIR}")
endif()
