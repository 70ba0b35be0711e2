# cmake/install_conf.cmake — installs kvtier.conf without overwriting a changed
# one (run by `cmake --install`, see cmake/package.cmake, which sets
# KVT_CONF_SRC and KVT_CONF_DIR, the latter relative to the install prefix
# unless absolute). DESTDIR applies. An installed file equal to the shipped one
# is left alone; one that differs (the operator's, or an older release's) stays,
# and the shipped file goes beside it as kvtier.conf.new.
if(IS_ABSOLUTE "${KVT_CONF_DIR}")
  set(dir "${KVT_CONF_DIR}")
else()
  set(dir "${CMAKE_INSTALL_PREFIX}/${KVT_CONF_DIR}")
endif()
set(dest "$ENV{DESTDIR}${dir}/kvtier.conf")
if(EXISTS "${dest}")
  file(SHA256 "${dest}" have)
  file(SHA256 "${KVT_CONF_SRC}" want)
  if(have STREQUAL want)
    message(STATUS "Up-to-date: ${dest}")
  else()
    message(STATUS "Keeping the changed ${dest}; the shipped one is ${dest}.new")
    file(INSTALL "${KVT_CONF_SRC}" DESTINATION "${dir}" RENAME kvtier.conf.new
      PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
  endif()
else()
  file(INSTALL "${KVT_CONF_SRC}" DESTINATION "${dir}" PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endif()
