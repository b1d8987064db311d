# Fails when the conductor's test binary contains engine symbols (tandem::engine::Transformer,
# the kernels): the conductor library must not link the engine.
execute_process(COMMAND nm -C ${TARGET_FILE} OUTPUT_VARIABLE symbols RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(WARNING "nm failed on ${TARGET_FILE}; the no-engine check is skipped")
  return()
endif()
string(FIND "${symbols}" "tandem::engine::Transformer" engine_at)
string(FIND "${symbols}" "tandem::kernels::" kernels_at)
if(NOT engine_at EQUAL -1 OR NOT kernels_at EQUAL -1)
  message(FATAL_ERROR "the conductor links the engine or the kernels (${TARGET_FILE})")
endif()
