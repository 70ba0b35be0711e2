# cmake/cpack_check.cmake — CPack's project config file: refuses to package a
# build the .deb must not carry (cmake/package.cmake explains why): the CUDA
# backend, -march=native, sanitizers, or a prefix other than /usr.
if(CPACK_KVT_BLOCKERS)
  string(REPLACE ";" "; " why "${CPACK_KVT_BLOCKERS}")
  message(FATAL_ERROR "kvtier: this build cannot be packaged: ${why}")
endif()
