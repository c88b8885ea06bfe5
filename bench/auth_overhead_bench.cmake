# auth_overhead_bench: heartbeat latency with TLS + tokens vs plaintext, same
# run (issue 15, acceptance 5; a benchmark, not a test). Needs the openssl CLI.
if(TARGET shardtrain_coordinator_service)
  add_executable(auth_overhead_bench ${CMAKE_CURRENT_LIST_DIR}/auth_overhead_bench.cc)
  target_link_libraries(auth_overhead_bench PRIVATE
    shardtrain_coordinator_service shardtrain_process CLI11::CLI11 absl::strings absl::str_format
    Threads::Threads)
endif()
