# What the native core may be built with: UCX, OpenSSL's libcrypto and CUDA, each
# ON (required), OFF, or AUTO (built when found; for CUDA, only when this machine also has
# a GPU). Sets RLBOOST_HAS_UCX, RLBOOST_HAS_AEAD and RLBOOST_HAS_CUDA.

# --- UCX (the libucx wheel ships a CMake package) -----------------------------------
set(RLBOOST_HAS_UCX OFF)
if(NOT RLBOOST_WITH_UCX STREQUAL "OFF")
  find_package(Python 3.10 QUIET COMPONENTS Interpreter)
  if(Python_EXECUTABLE)
    execute_process(
      COMMAND ${Python_EXECUTABLE} -c "import libucx, os; print(os.path.dirname(libucx.__file__))"
      OUTPUT_VARIABLE _libucx_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(_libucx_dir)
    list(APPEND CMAKE_PREFIX_PATH ${_libucx_dir})
  endif()
  find_package(ucx CONFIG QUIET)
  if(ucx_FOUND)
    set(RLBOOST_HAS_UCX ON)
  elseif(RLBOOST_WITH_UCX STREQUAL "ON")
    message(FATAL_ERROR "RLBOOST_WITH_UCX=ON but UCX was not found (pip install libucx-cu12==1.21.*)")
  endif()
endif()

# --- libcrypto (AES-256-GCM sealing of frames: transfer.encrypt) -----------------------
# No cipher is written here: sealing comes from OpenSSL's libcrypto or is not built. AUTO
# builds without it when it is missing, and says what that means; ON makes that an error.
set(RLBOOST_HAS_AEAD OFF)
if(NOT RLBOOST_WITH_OPENSSL STREQUAL "OFF")
  find_package(OpenSSL QUIET COMPONENTS Crypto)
  if(OPENSSL_FOUND AND TARGET OpenSSL::Crypto)
    set(RLBOOST_HAS_AEAD ON)
  elseif(RLBOOST_WITH_OPENSSL STREQUAL "ON")
    message(FATAL_ERROR "RLBOOST_WITH_OPENSSL=ON but OpenSSL's libcrypto was not found (apt-get install "
            "libssl-dev); or build without encryption with RLBOOST_WITH_OPENSSL=OFF.")
  else()
    message(WARNING "rlboost: building without AES-256-GCM (OpenSSL's libcrypto was not found): "
            "transfer.encrypt=on will be refused, and auto sends weights off loopback in clear text "
            "(MACed). Install libssl-dev, or set RLBOOST_WITH_OPENSSL=ON to make this an error.")
  endif()
endif()

# --- CUDA (the KV page gather/scatter kernels) -----------------------------------------
# ON: built, or the build fails. OFF: never. AUTO: built only when this machine has an
# NVIDIA GPU (the driver lists one under /proc/driver/nvidia/gpus, or nvidia-smi -L names
# one) and a working nvcc: an nvcc on PATH alone (a CUDA toolkit on a CPU machine) would
# spend minutes compiling kernels nothing here can run. nvcc is looked for where CUDA
# installs put it: CMAKE_CUDA_COMPILER, $CUDACXX, PATH, $CUDA_HOME/bin, $CUDA_PATH/bin and
# /usr/local/cuda/bin.
set(RLBOOST_CUDA_ARCHITECTURES "80-real;90" CACHE STRING
    "CUDA targets: sm_80 (A100) and sm_90 (H100/H200) machine code, plus compute_90 PTX for newer GPUs")
set(RLBOOST_HAS_CUDA OFF)

function(rlboost_gpu_present out)
  file(GLOB _gpus /proc/driver/nvidia/gpus/*)
  if(_gpus)
    set(${out} ON PARENT_SCOPE)
    return()
  endif()
  find_program(_smi nvidia-smi)
  if(_smi)
    execute_process(COMMAND ${_smi} -L OUTPUT_VARIABLE _listed RESULT_VARIABLE _rc ERROR_QUIET TIMEOUT 20)
    if(_rc EQUAL 0 AND _listed MATCHES "GPU [0-9]")
      set(${out} ON PARENT_SCOPE)
      return()
    endif()
  endif()
  set(${out} OFF PARENT_SCOPE)
endfunction()

set(_want_cuda OFF)
if(RLBOOST_WITH_CUDA STREQUAL "ON")
  set(_want_cuda ON)
elseif(RLBOOST_WITH_CUDA STREQUAL "AUTO")
  rlboost_gpu_present(_want_cuda)
  if(NOT _want_cuda)
    message(STATUS "rlboost: no GPU on this machine: building without the CUDA kernels "
                   "(RLBOOST_WITH_CUDA=ON builds them anyway)")
  endif()
endif()
if(_want_cuda AND RLBOOST_CUDA_SOURCES)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(RLBOOST_NVCC nvcc)
    if(NOT RLBOOST_NVCC)
      find_program(RLBOOST_NVCC nvcc NO_DEFAULT_PATH
                   PATHS "$ENV{CUDA_HOME}/bin" "$ENV{CUDA_PATH}/bin" /usr/local/cuda/bin)
    endif()
    if(RLBOOST_NVCC)
      set(ENV{CUDACXX} "${RLBOOST_NVCC}")  # check_language's probe reads it
    endif()
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES ${RLBOOST_CUDA_ARCHITECTURES})
    endif()
    enable_language(CUDA)
    find_package(CUDAToolkit QUIET)
    if(CUDAToolkit_FOUND)
      set(RLBOOST_HAS_CUDA ON)
    endif()
  endif()
  if(NOT RLBOOST_HAS_CUDA)
    string(CONCAT _cuda_missing "no working nvcc and CUDA toolkit were found (looked at "
           "CMAKE_CUDA_COMPILER, CUDACXX, PATH, CUDA_HOME/bin, CUDA_PATH/bin, /usr/local/cuda/bin)")
    if(RLBOOST_WITH_CUDA STREQUAL "ON")
      message(FATAL_ERROR "RLBOOST_WITH_CUDA=ON but ${_cuda_missing}. Install the CUDA toolkit or set "
              "CUDA_HOME to it; or build without the KV page kernels with RLBOOST_WITH_CUDA=OFF.")
    endif()
    message(WARNING "rlboost: this machine has a GPU but ${_cuda_missing}: building without CUDA kernels, "
            "so GPU engines migrate samples without their KV pages. Set RLBOOST_WITH_CUDA=ON to make this an error.")
  endif()
endif()
