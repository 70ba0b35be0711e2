# cmake/package.cmake — install rules (cmake --install) and the Debian package
# (cpack -G DEB). Included from CMakeLists.txt after the kvtier and kvtierd
# targets.
#
# Layout (GNUInstallDirs, FHS): PREFIX/bin/{kvtierd,kvtier}, the man pages in
# PREFIX/share/man (gzip'd), README and the wire format in PREFIX/share/doc/kvtier,
# the configuration in SYSCONFDIR/kvtier/kvtier.conf (SYSCONFDIR is /etc for
# the prefix /usr, else PREFIX/etc) and the systemd unit in KVT_SYSTEMD_UNITDIR
# (/lib/systemd/system for the prefix /usr, as Debian 12 keeps units; else
# PREFIX/lib/systemd/system, which systemd also searches for /usr/local). The
# unit's paths are those of the prefix configured at build time: an install
# with another --prefix keeps them (configure with -DCMAKE_INSTALL_PREFIX=P).
#
# The configuration is never overwritten: an installed kvtier.conf that differs
# from the shipped one stays, and the shipped one is put beside it as
# kvtier.conf.new (cmake/install_conf.cmake); in the package it is a conffile,
# so dpkg asks instead.
#
# The package is CPU-only by design: it is built from a KVT_CUDA=OFF,
# KVT_NATIVE=OFF build without sanitizers (cpack refuses anything else, see
# cmake/cpack_check.cmake), so it runs on any x86-64 machine with or without
# the CUDA runtime, and its dependencies are Debian packages only (computed by
# dpkg-shlibdeps). A CUDA build is installed from source.
include(GNUInstallDirs)

# empty: chosen from the prefix at every configure (a relative one is under the prefix)
set(KVT_SYSTEMD_UNITDIR "" CACHE STRING "Directory of the systemd unit kvtier.service (default: from the prefix)")
if(KVT_SYSTEMD_UNITDIR)
  set(kvt_unitdir ${KVT_SYSTEMD_UNITDIR})
elseif(CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  set(kvt_unitdir /lib/systemd/system)
else()
  set(kvt_unitdir lib/systemd/system)
endif()
set(KVT_FULL_BINDIR ${CMAKE_INSTALL_FULL_BINDIR})
set(KVT_FULL_DOCDIR ${CMAKE_INSTALL_FULL_DOCDIR})
set(KVT_CONF_FILE ${CMAKE_INSTALL_FULL_SYSCONFDIR}/kvtier/kvtier.conf)
configure_file(${CMAKE_SOURCE_DIR}/configs/kvtier.service.in ${KVT_GEN_DIR}/kvtier.service @ONLY)

install(TARGETS kvtierd kvtier RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES ${KVT_GEN_DIR}/kvtierd.8.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man8)
install(FILES ${KVT_GEN_DIR}/kvtier.1.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1)
install(FILES ${KVT_GEN_DIR}/kvtier.conf.5.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man5)
install(FILES ${KVT_GEN_DIR}/kvtier.service DESTINATION ${kvt_unitdir})
install(FILES README.md docs/http-api.md DESTINATION ${CMAKE_INSTALL_DOCDIR})
install(FILES configs/README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} RENAME configs.md)
install(FILES packaging/deb/copyright DESTINATION ${CMAKE_INSTALL_DOCDIR})
# the config: DESTDIR applies, and the install-time prefix where SYSCONFDIR is
# under it (GNUInstallDirs puts it at /etc for the prefix /usr)
if(CMAKE_INSTALL_FULL_SYSCONFDIR STREQUAL "${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_SYSCONFDIR}")
  set(conf_dir ${CMAKE_INSTALL_SYSCONFDIR}/kvtier)
else()
  set(conf_dir ${CMAKE_INSTALL_FULL_SYSCONFDIR}/kvtier)
endif()
install(CODE "set(KVT_CONF_SRC \"${CMAKE_SOURCE_DIR}/configs/kvtier.conf\")
set(KVT_CONF_DIR \"${conf_dir}\")")
install(SCRIPT cmake/install_conf.cmake)

# The install rules, into a scratch tree (tests/install/test_install.cmake)
enable_testing()
add_test(NAME test_install COMMAND ${CMAKE_COMMAND} -DBUILD=${CMAKE_BINARY_DIR} -DSRC=${CMAKE_SOURCE_DIR}
  -DWORK=${CMAKE_BINARY_DIR}/install_test -DBINDIR=${KVT_FULL_BINDIR} -DCONF=${KVT_CONF_FILE}
  -P ${CMAKE_SOURCE_DIR}/tests/install/test_install.cmake)
set_tests_properties(test_install PROPERTIES LABELS unit TIMEOUT 120)

# ---- the Debian package ----
set(KVT_DEB_RELEASE 1)
set(KVT_DEB_VERSION ${PROJECT_VERSION}-${KVT_DEB_RELEASE})
set(KVT_DEB_MAINTAINER "kvtier maintainers <kvtier@example.org>")
configure_file(packaging/deb/changelog.in ${KVT_GEN_DIR}/changelog.Debian @ONLY)
configure_file(packaging/deb/conffiles.in ${KVT_GEN_DIR}/deb/conffiles @ONLY)
foreach(s postinst prerm postrm)
  configure_file(packaging/deb/${s} ${KVT_GEN_DIR}/deb/${s} COPYONLY)
endforeach()
add_custom_command(OUTPUT ${KVT_GEN_DIR}/changelog.Debian.gz
  COMMAND Python3::Interpreter -c "import gzip,sys; open(sys.argv[2],'wb').write(gzip.compress(open(sys.argv[1],'rb').read(),9,mtime=0))"
    ${KVT_GEN_DIR}/changelog.Debian ${KVT_GEN_DIR}/changelog.Debian.gz
  DEPENDS ${KVT_GEN_DIR}/changelog.Debian VERBATIM)
add_custom_target(kvt_changelog ALL DEPENDS ${KVT_GEN_DIR}/changelog.Debian.gz)
add_dependencies(kvtierd kvt_changelog)
install(FILES ${KVT_GEN_DIR}/changelog.Debian.gz DESTINATION ${CMAKE_INSTALL_DOCDIR})

set(KVT_PACKAGE_BLOCKERS "")
if(KVT_HAVE_CUDA)
  list(APPEND KVT_PACKAGE_BLOCKERS "the CUDA backend is built (configure with -DKVT_CUDA=OFF)")
endif()
if(KVT_NATIVE)
  list(APPEND KVT_PACKAGE_BLOCKERS "-march=native code runs on this CPU only (configure with -DKVT_NATIVE=OFF)")
endif()
if(KVT_SANITIZE)
  list(APPEND KVT_PACKAGE_BLOCKERS "a sanitizer build (configure without KVT_SANITIZE)")
endif()
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  list(APPEND KVT_PACKAGE_BLOCKERS "the prefix is ${CMAKE_INSTALL_PREFIX} (configure with -DCMAKE_INSTALL_PREFIX=/usr)")
endif()
set(CPACK_KVT_BLOCKERS "${KVT_PACKAGE_BLOCKERS}")
set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_SOURCE_DIR}/cmake/cpack_check.cmake)

set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME kvtier)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_CONTACT "${KVT_DEB_MAINTAINER}")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "three-tier KV-cache store and LLM inference daemon")
set(CPACK_PACKAGE_DESCRIPTION "kvtier keeps the attention K/V of every conversation it has served in device
memory, pinned host memory and an NVMe file, and finds it again by prefix
hash, so that a returning conversation, even after a restart, pages its
KV back in instead of prefilling its whole history again. kvtierd serves
an OpenAI-compatible HTTP API from one GGUF model (Llama family); kvtier
is its command line. This package has the CPU backend.")
set(CPACK_PACKAGING_INSTALL_PREFIX ${CMAKE_INSTALL_PREFIX})
set(CPACK_SET_DESTDIR ON) # the absolute /etc and /lib paths go into the package, not onto this machine
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT) # kvtier_VERSION-RELEASE_ARCH.deb
set(CPACK_DEBIAN_PACKAGE_RELEASE ${KVT_DEB_RELEASE})
set(CPACK_DEBIAN_PACKAGE_SECTION misc)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
  ${KVT_GEN_DIR}/deb/postinst ${KVT_GEN_DIR}/deb/prerm ${KVT_GEN_DIR}/deb/postrm ${KVT_GEN_DIR}/deb/conffiles)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
