list(APPEND RLBOOST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tcp/tcp_transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm/shm_region.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm/shm_transport.cpp)
# Built only when CMake finds UCX (RLBOOST_HAS_UCX).
list(APPEND RLBOOST_UCX_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/ucx/ucx_worker.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ucx/ucx_client.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ucx/ucx_service.cpp)
