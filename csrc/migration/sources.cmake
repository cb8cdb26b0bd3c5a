list(APPEND RLBOOST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/state_codec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/batch_codec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kv_pages.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stream_copy.cpp)
list(APPEND RLBOOST_CUDA_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/kv_pages_cuda.cu)
