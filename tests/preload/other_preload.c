/*
 * other_preload.so - someone else's preload, doing nothing: listed in LD_PRELOAD
 * beside geco's, it must stay there (and mapped) when a shepherd's exec takes geco's
 * library out.
 */
int geco_test_other_preload = 1;
