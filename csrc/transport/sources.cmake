list(APPEND RLBOOST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/registry.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tcp/socket.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tcp/frame_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tcp/handshake.cpp
  ${CMAKE_CURRENT_LIST_DIR}/tcp/tcp_transport.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm/shm_region.cpp
  ${CMAKE_CURRENT_LIST_DIR}/shm/shm_transport.cpp)
# Built only when CMake finds UCX (RLBOOST_HAS_UCX).
list(APPEND RLBOOST_UCX_SOURCES)
