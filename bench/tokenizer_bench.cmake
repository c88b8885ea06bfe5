# tokenizer_bench: BPE MB/s, GPT-2, Llama 3 (byte-level) and Llama 2
# (SentencePiece-style) (ByteLevelBpe, prepare with 1 and 2 threads) next to @lenml/tokenizers under node, same
# text, same run.
if(TARGET shardtrain_prepare)
  add_executable(tokenizer_bench ${CMAKE_CURRENT_LIST_DIR}/tokenizer_bench.cc)
  target_link_libraries(tokenizer_bench PRIVATE
    shardtrain_prepare shardtrain_bpe CLI11::CLI11 Threads::Threads)
  target_compile_definitions(tokenizer_bench PRIVATE SHARDTRAIN_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
  target_include_directories(tokenizer_bench PRIVATE ${PROJECT_SOURCE_DIR})
endif()
