# checkpoint_bench: sharded checkpoint save (4 ranks) / LoadAll / resharding
# LoadRange of GPT-2 124M vs plain write()/read() of the same bytes.
if(TARGET shardtrain_checkpoint_format)
  add_executable(checkpoint_bench ${CMAKE_CURRENT_LIST_DIR}/checkpoint_bench.cc)
  target_link_libraries(checkpoint_bench PRIVATE
    shardtrain_checkpoint_format shardtrain_engine_cpu CLI11::CLI11 Threads::Threads)
  target_compile_options(checkpoint_bench PRIVATE -O2)
endif()
