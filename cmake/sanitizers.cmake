# RLBOOST_SANITIZE: every target of this build instrumented alike, so the Python modules,
# the C++ unit tests and the fuzz harnesses report the same way.
#   address: AddressSanitizer + UndefinedBehaviorSanitizer (any undefined behaviour aborts)
#   thread:  ThreadSanitizer
# A Python process loads an instrumented module only with the sanitizer's runtime
# preloaded: scripts/native_checks/sanitize.sh does that.
if(RLBOOST_SANITIZE STREQUAL "address")
  set(_rlboost_sanitize_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined
      -fno-omit-frame-pointer -g -O1)
elseif(RLBOOST_SANITIZE STREQUAL "thread")
  set(_rlboost_sanitize_flags -fsanitize=thread -fno-omit-frame-pointer -g -O1)
endif()
if(_rlboost_sanitize_flags)
  add_compile_options(${_rlboost_sanitize_flags})
  add_link_options(${_rlboost_sanitize_flags})
endif()

# RLBOOST_FUZZ: libFuzzer harnesses (tests/fuzz), clang only. The core is built with the
# fuzzer's coverage hooks and ASan + UBSan, so a harness finds memory errors as crashes.
if(RLBOOST_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "RLBOOST_FUZZ needs clang (CXX=clang++); scripts/native_checks/fuzz.sh sets it")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
                      -fno-omit-frame-pointer -g -O1)
  add_link_options(-fsanitize=address,undefined)
endif()
