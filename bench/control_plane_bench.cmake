# control_plane_bench: coordinator RPC latency under simulated worker load vs an
# empty unary RPC on the same gRPC stack (a benchmark, not a test).
if(TARGET shardtrain_coordinator_service)
  add_executable(control_plane_bench ${CMAKE_CURRENT_LIST_DIR}/control_plane_bench.cc)
  target_link_libraries(control_plane_bench PRIVATE
    shardtrain_coordinator_service CLI11::CLI11 absl::strings absl::str_format
    Threads::Threads)
endif()
