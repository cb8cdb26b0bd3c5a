list(APPEND RLBOOST_SOURCES
  ${CMAKE_CURRENT_LIST_DIR}/socket.cpp
  ${CMAKE_CURRENT_LIST_DIR}/frame_io.cpp
  ${CMAKE_CURRENT_LIST_DIR}/frame_seal.cpp
  ${CMAKE_CURRENT_LIST_DIR}/handshake.cpp
  ${CMAKE_CURRENT_LIST_DIR}/peer_process.cpp
  ${CMAKE_CURRENT_LIST_DIR}/login_stage.cpp
  ${CMAKE_CURRENT_LIST_DIR}/interrupt.cpp
  ${CMAKE_CURRENT_LIST_DIR}/connection_pool.cpp)
