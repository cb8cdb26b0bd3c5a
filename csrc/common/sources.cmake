# common/ is header-only for now; components add .cpp files here when they need them.
